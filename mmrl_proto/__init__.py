"""The gRPC stubs generated from `protos/mmrl_proto/v1/*.proto` (proto package `mmrl.v1`), below every
service and the command line: nothing here is edited by hand (`make protos` regenerates `v1`)."""
