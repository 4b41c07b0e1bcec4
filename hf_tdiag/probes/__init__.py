"""Getting tensors out of Hugging Face models: one adapter per architecture family."""
