"""Code every service may import: logging, gRPC serving, shared storage, the trajectory schema."""
