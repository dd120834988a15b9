"""Generation shared by every model family: ``glm-generate`` (``cli``) and the ranks of a parallel run
(``parallel``). A family plugs in through ``glm_port.models``' registry (``Family.generation``)."""
