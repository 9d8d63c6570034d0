"""Adapters that put Boltzmann attention into other libraries' models.

``boltzmann_attention.integrations.transformers``: Hugging Face transformers decoders (GPT-2, Llama
family) through transformers' ``AttentionInterface``. Each adapter imports its library when it is imported
itself, so this package imports nothing optional.
"""
