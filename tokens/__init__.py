"""Token-level views of a completion: sampled ids back into the message a chat endpoint would give."""
