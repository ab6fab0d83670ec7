"""Sessions: the session stages, and streamed responses that survive the client, the backend and the replica."""
