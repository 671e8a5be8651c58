"""The Batch APIs over HTTP (issue 44): OpenAI's files and batches, Anthropic's message
batches, and the line runner that sends each line through the conductor."""
