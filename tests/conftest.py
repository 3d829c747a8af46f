"""Shared test set-up: no model hub, quiet logs, and tiny in-memory HF models."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Speculation rationed by the step budget alone, not by step times measured on this machine:
# the tests that check speculative output need the drafts the lookup finds verified on every
# machine, however loaded (test_speculative_engine.py turns the measured rationing back on).
os.environ.setdefault("SGL_SPEC_COST_RATIONING", "0")
