"""`mmrl env check`: the EnvService contract, run as named checks against any env server
(docs/environments.md). A tool, not a service: it talks to the server through the generated stubs."""
