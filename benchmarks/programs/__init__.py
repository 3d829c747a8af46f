"""The program workloads of the SGLang paper (Zheng et al., NeurIPS 2024), each written twice:
as an sgl program (`workloads.py`) and as the plain client code a vLLM or llama.cpp user writes
against `/v1/completions` (the same module, `plain_*`). Data is synthetic and seeded
(`data.py`); `bench_program_workloads.py` runs them side by side."""
