"""Task specs (``spec``: the YAML in ``evals/``, its version and digest), their problems
(datasets from the hub or local files) and prompts (chat template, thinking budget),
and the grader each task names.

May import: decoding, graders.
"""
