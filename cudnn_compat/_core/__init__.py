"""The core under every family: the call path (``call``: signature, plan cache, graph, plan,
execute; ``bound_graph``: graphs over byte offsets of caller buffers), argument conversion and
the legacy registry (``registry``, ``signatures``), data and scalar binding (``data``,
``fastbind``), where a handle runs (``place``), descriptors and their lifecycle table
(``descriptor``, ``lifecycle``), per-descriptor-state memos (``memo``) and cuDNN's logging
variables (``log``)."""
