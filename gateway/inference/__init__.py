"""The shared language of the request path: the request and result types that flow
between the API, the dispatcher and the backends (`types`), prompt templates, token
estimates and ids. Imports nothing else of the gateway.
"""
