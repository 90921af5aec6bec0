"""Generated protobuf and gRPC code for the ``chronoshard.v1`` API (do not edit by hand).

The sources are the ``*.proto`` files beside this package; regenerate with
``python -m chronoshard.protogen``. Only the servicers and the client/SDK adapters import
these modules; they convert messages to the project's own types at the edge.
"""
