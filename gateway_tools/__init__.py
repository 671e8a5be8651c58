"""The offline tools: the demo and simulated Triton models, the eval, the coding tools'
configurations, usage reports. None of it runs in a serving process."""
