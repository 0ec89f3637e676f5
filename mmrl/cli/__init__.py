"""The `mmrl` command line: a thin dispatcher over the services and the REST API."""
