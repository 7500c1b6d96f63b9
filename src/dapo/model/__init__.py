"""Loading the policy: any Hugging Face causal LM by path, a GGUF file, or the embedded tiny Qwen2."""
