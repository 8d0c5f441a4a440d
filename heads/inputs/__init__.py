"""Input builders: prompts, task items and token sequences. Plain data: nothing here runs a
model."""
