"""cuDNN's backend (graph) API over the graph layer (002 ch. 9): ``api`` (the descriptor calls,
Finalize, Execute), ``attributes`` (the attribute table) and ``operations`` (Finalize of the
tensor, operator and operation descriptors)."""
