"""Runs started by events: S3 objects (EventBridge, S3 notifications via SNS/SQS) and config files
dropped into the shared inbox. docs/triggers.md describes them."""
