"""The data every task shares: sentence pairs and their batches, downloads, tokenizers and the token store."""
