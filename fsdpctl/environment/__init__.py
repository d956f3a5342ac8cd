"""Python environments made on the nodes from a user's lock (``environment:``): resolved here with uv
for each node's platform, their wheels sent to nodes that cannot download them, made and cached there."""
