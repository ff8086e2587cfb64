"""open-instruct (source only): its async GRPO data path, `accumulate_inference_batches` over a real Ray queue,
fed by its real vLLM request path against the bench's OpenAI-compatible server."""
