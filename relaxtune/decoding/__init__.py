"""The decoding core: the relaxed rules (``rules``, ``engine_rules``) and their
registry (``methods``, with the contract in ``spec`` and named knobs in ``knobs``:
engine names, ranges, strict points, needs), the engines' round-level rules
(``fly``: vLLM FLy; ``trtllm``: TensorRT-LLM relaxed MTP acceptance; registered in
``engine_methods``) and their hook (``hooks``), the sampling transform
(``sampling``), one verification round (``round``: accept test, residual, bonus),
the speed model and cost profiles (``speed``), and the signs of rambling
(``rambling``). Pure functions on rows and numbers: no models, no tasks, no files.

May import: nothing of relaxtune outside this wing.
"""
