"""Tool calls judged in the request path: the `ToolPolicy` and `CollectApproval` stages and the approval service."""
