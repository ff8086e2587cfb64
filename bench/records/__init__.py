"""What a run records, the ground every other part stands on: sample records (`sample`), the request log
(`request_log`), the tokens the server served (`served_tokens`), and which trajectory a request, a task or an
exception belongs to (`attribution`: the headers that name it, and the context every record is stamped from).

The server writes requests and served tokens, targets write samples, invariants and the report read them all;
nothing here imports any of those (`tests/test_layout.py`).
"""
