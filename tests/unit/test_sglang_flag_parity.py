"""Our launch_server flags against SGLang 0.5's: each of its flags is accepted here, or listed
below as missing by design with the reason. A new SGLang flag in the data file, or a flag we
drop, fails until it is placed in one or the other."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from sgl.server.launch import build_parser

SGLANG_FLAGS = Path(__file__).parent / "data" / "sglang_0_5_launch_flags.txt"

# reason -> the flag patterns (fnmatch) it covers
MISSING_BY_DESIGN: dict[str, list[str]] = {
    "multi-node, pipeline, expert, context and attention parallelism (we shard by --tp-size on one machine)": [
        "--dist-*", "--nccl-*", "--nnodes", "--node-rank", "--pp-*", "--pipeline-parallel-size", "--ep", "--ep-*",
        "--expert-parallel-size", "--max-ep-size", "--moe-data-parallel-size", "--moe-dp-size", "--moe-dense-tp-size",
        "--moe-a2a-backend", "--moe-runner-backend", "--attention-*-parallel-size", "--attn-*", "--dcp-*",
        "--decode-context-parallel-size", "--dwdp-size", "--enable-dp-*", "--enable-prefill-cp", "--cp-strategy",
        "--enable-cp-decode-attn-tp", "--elastic-ep-*", "--eplb-*", "--enable-eplb", "--init-expert-location",
        "--enable-elastic-expert-backup", "--ep-*", "--load-balance-method", "--base-gpu-id", "--gpu-id-step",
        "--use-ray", "--gated-launch-port", "--pre-warm-nccl", "--enable-nccl-nvls", "--enable-mscclpp",
        "--enable-symm-mem", "--enable-torch-symm-mem", "--disable-custom-all-reduce", "--enable-p2p-check",
        "--shared-experts-tp-size", "--enable-tp-lm-head-all-to-all", "--disable-attn-tp-gather",
        "--enable-attn-tp-input-scattered", "--enable-dense-mlp-attn-tp", "--enable-shared-experts-attn-tp",
        "--enable-quant-communications", "--enable-fused-moe-sum-all-reduce", "--deepep-*", "--fuseep-mode",
        "--enable-two-batch-overlap", "--tbo-*", "--enable-single-batch-overlap", "--enable-layernorm-sp",
        "--enable-megamoe-for-layernorm-sp", "--boundary-reduction", "--enable-kv-cache-sharding", "--sm-group-num",
        "--numa-node", "--expert-distribution-*", "--expert-balancedness-report-mode",
    ],
    "prefill/decode and encoder disaggregation": [
        "--disaggregation-*", "--encoder-*", "--engine-info-bootstrap-port", "--enable-pd-role-switch",
        "--enable-pdmux", "--pdmux-config-path", "--prefill-decode-interval*", "--enable-adaptive-dispatch-to-encoder",
        "--decoupled-spec-*", "--mooncake-ib-device", "--language-only", "--encoder-only",
    ],
    "LoRA adapters": [
        "--lora-*", "--enable-lora*", "--max-lora*", "--max-loaded-loras", "--max-loras-per-batch", "--uno-lora-path",
        "--experts-shared-outer-loras",
    ],
    "hierarchical, external and sparse KV caches (one radix cache in device memory here)": [
        "--hicache-*", "--enable-hicache", "--enable-hierarchical-cache", "--enable-lmcache", "--lmcache-config-file",
        "--enable-flexkv", "--flexkv-config-file", "--enable-unified-cache-external-linker",
        "--unified-cache-external-linker-*", "--enable-linker-mla-dedup", "--kv-events-config", "--radix-cache-backend",
        "--hisparse-config", "--enable-hisparse", "--hierarchical-sparse-attention-extra-config",
        "--enable-session-radix-cache", "--page-size",
    ],
    "speculative decoding": [
        "--speculative-*", "--enable-multi-layer-eagle", "--spec-trace-dir", "--enable-draft-weights-cpu-backup",
        "--decrypted-draft-config-file",
    ],
    "multimodal, speech and embedding models (text generation only)": [
        "--mm-*", "--enable-multimodal", "--image-processor-backend", "--disable-fast-image-processor",
        "--limit-mm-data-per-request", "--media-url-max-file-size-mb", "--allowed-media-domains",
        "--trust-mm-content-hashes", "--enable-broadcast-mm-inputs-process", "--enable-prefix-mm-cache",
        "--enable-precise-embedding-interpolation", "--enable-mm-global-cache", "--asr-*", "--language-model-only",
        "--is-embedding", "--file-storage-path",
    ],
    "architectures we do not implement (Mamba, SWA, DSA/MLA, DeepSeek V4, linear attention, dLLM, offloaded MoE)": [
        "--mamba-*", "--max-mamba-cache-size", "--int8-mamba-ckpt-size", "--enable-int8-mamba-checkpoint",
        "--enable-mamba-cache-stochastic-rounding", "--swa-*", "--disable-hybrid-swa-memory",
        "--enable-*-swa-bounded-replay", "--dsa-*", "--enable-dsa-*", "--dsv4-*", "--enable-deepseek-v4-fp4-indexer",
        "--qsa-indexer-dtype", "--c128-page-size", "--linear-attn-*", "--linear-replayssm-*",
        "--enable-linear-replayssm*", "--enable-scattered-sconv", "--dllm-*", "--flashinfer-mla-disable-ragged",
        "--disable-chunked-prefix-cache", "--disable-shared-experts-fusion", "--enforce-shared-experts-fusion",
        "--paged-experts-num-resident", "--enable-paged-experts", "--enable-w4a4-mxfp4-megamoe", "--kt-*",
        "--enable-return-routed-experts", "--enable-return-indexer-topk", "--enable-fused-qk-norm-rope",
        "--ple-offload-*", "--enable-mis",
    ],
    "hardware and kernel choices we do not target (ROCm, MLX, fp4/fp8 GEMMs, FlashInfer and CUDA-graph knobs)": [
        "--*aiter*", "--enable-amd-monokernel", "--monokernel-backend", "--enable-nvidia-megakernel", "--mlx-*",
        "--fp4-gemm-backend", "--fp8-gemm-backend", "--bf16-gemm-backend", "--*flashinfer-*", "--cuda-graph-*",
        "--disable-decode-cuda-graph", "--disable-prefill-cuda-graph", "--disable-cuda-graph-padding",
        "--debug-cuda-graph", "--enable-profile-cuda-graph", "--enable-cudagraph-gc", "--triton-attention-*",
        "--decode-attention-backend", "--prefill-attention-backend", "--sampling-backend", "--enable-tf32-matmul",
        "--enable-fp32-lm-head", "--enable-lean-attention", "--enable-waterfill", "--enable-page-major-kv-layout",
        "--enable-unified-memory", "--enable-memory-saver", "--msprobe-dump-config", "--torch-compile-max-bs",
        "--enable-torch-compile-debug-mode", "--enable-mixed-chunk", "--disable-overlap-schedule",
        "--num-continuous-decode-steps", "--scheduler-recv-interval", "--enable-dynamic-chunking",
    ],
    "model sources and loaders (hub downloads, remote code, remote/streamed weights, ModelOpt, offloading, RL)": [
        "--download-dir", "--revision", "--trust-remote-code", "--model-impl", "--model-loader-extra-config",
        "--custom-weight-loader", "--remote-instance-weight-loader-*", "--weight-loader-*", "--weight-cache-*",
        "--weight-version", "--modelopt-*", "--modelexpress-config", "--quantization-param-path",
        "--quantize-and-serve", "--delete-ckpt-after-loading", "--checkpoint-engine-wait-weights-before-ready",
        "--startup-weight-load-mode", "--model-checksum", "--decrypted-config-file", "--json-model-override-args",
        "--model-config-parser", "--cpu-offload-gb", "--offload-*", "--enable-weights-cpu-backup", "--rl-*",
    ],
    "tokenizer processes and modes (one in-process HF tokenizer here)": [
        "--tokenizer-mode", "--tokenizer-backend", "--skip-tokenizer-init", "--tokenizer-worker-num",
        "--detokenizer-worker-num", "--enable-dynamic-batch-tokenizer", "--dynamic-batch-tokenizer-*",
        "--enable-tokenizer-batch-encode", "--disable-tokenizer-batch-decode",
    ],
    "tracing, metric buckets and labels, dumps, watchdogs, request-log formats (our /metrics and --log-requests are fixed)": [
        "--otlp-*", "--enable-trace", "--trace-modules", "--bucket-*", "--*-buckets", "--extra-metric-labels",
        "--tokenizer-metrics-*", "--enable-metrics-for-all-schedulers", "--enable-mfu-metrics",
        "--enable-forward-pass-metrics", "--forward-pass-metrics-*", "--export-metrics-to-file*",
        "--crash-dump-folder", "--debug-tensor-dump-*", "--watchdog-timeout", "--soft-watchdog-timeout",
        "--show-time-cost", "--decode-log-interval", "--log-requests-format", "--log-requests-level",
        "--log-requests-target", "--log-level-http", "--enable-request-time-stats-logging", "--enable-cache-report",
        "--gc-threshold", "--gc-warning-threshold-secs", "--enable-layerwise-nvtx-marker",
        "--uvicorn-access-log-exclude-prefixes", "--kv-canary*", "--load-publish-endpoint",
        "--load-snapshot-publish-interval", "--enable-return-hidden-states", "--return-hidden-states-mode",
        "--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids", "--forward-hooks",
    ],
    "transports and front doors we do not serve (gRPC, HTTP/2, TLS, sidecars, admin key, root path, tool server)": [
        "--grpc-*", "--smg-*", "--sidecar*", "--enable-http2", "--http2-*", "--ssl-*", "--enable-ssl-refresh",
        "--enable-http-worker-reuseport", "--admin-api-key", "--fastapi-root-path", "--tool-server",
        "--enable-response-store",
    ],
    "scheduling policies we do not have (priorities, preemption, prefill delayer, eviction and retraction policies)": [
        "--enable-priority-scheduling", "--priority-*", "--schedule-low-priority-values-first",
        "--default-priority-value", "--abort-on-priority-when-disabled", "--disable-priority-preemption",
        "--prefill-delayer-*", "--enable-prefill-delayer", "--retraction-policy", "--radix-eviction-policy*",
        "--schedule-conservativeness", "--min-free-slots-delay", "--optimistic-prefill-attempts",
        "--prefill-max-requests", "--num-reserved-decode-tokens", "--context-bucket", "--sleep-on-idle",
        "--prefill-only-disable-kv-cache", "--prefill-kv-cache-dequant-dtype", "--strip-thinking-cache",
        "--enable-strict-thinking", "--sampling-mask-max-tokens",
    ],
    "request defaults and API extras not offered (server-side sampling defaults, template names, watermarks, warm-up)": [
        "--completion-template", "--hf-chat-template-name", "--default-chat-template-kwargs",
        "--trust-request-chat-template", "--preferred-sampling-params", "--sampling-defaults", "--constrained-json-*",
        "--allow-auto-truncate", "--stream-response-default-include-usage", "--incremental-streaming-output",
        "--enable-custom-logit-processor", "--enable-deterministic-inference", "--return-input-ids",
        "--return-output-ids", "--batch-notify-size", "--enable-watermark", "--watermark-config", "--warmups",
        "--skip-server-warmup", "--disable-outlines-disk-cache", "--enable-streaming-session", "--stream-interval",
    ],
}


def sglang_flags() -> list[str]:
    lines = SGLANG_FLAGS.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.startswith("--")]


def our_flags() -> set[str]:
    return set(build_parser()._option_string_actions)


def reason_for(flag: str) -> str | None:
    return next((r for r, pats in MISSING_BY_DESIGN.items() if any(fnmatch.fnmatchcase(flag, p) for p in pats)), None)


def test_the_data_file_holds_sglangs_flags() -> None:
    flags = sglang_flags()
    assert len(flags) > 300 and len(set(flags)) == len(flags)
    for core in ("--model-path", "--tp-size", "--port", "--chat-template", "--tool-call-parser", "--config"):
        assert core in flags


def test_every_sglang_flag_is_ours_or_missing_by_design() -> None:
    ours = our_flags()
    unplaced = [f for f in sglang_flags() if f not in ours and reason_for(f) is None]
    assert unplaced == [], f"SGLang flags neither accepted nor listed in MISSING_BY_DESIGN: {unplaced}"


def test_the_table_lists_no_flag_we_accept_and_no_dead_pattern() -> None:
    ours, theirs = our_flags(), sglang_flags()
    assert sorted(f for f in theirs if f in ours and reason_for(f) is not None) == []
    dead = [p for pats in MISSING_BY_DESIGN.values() for p in pats if not fnmatch.filter(theirs, p)]
    assert dead == []
