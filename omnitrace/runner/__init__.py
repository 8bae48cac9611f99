"""What `omnitrace run` does around its command, as a library: the agent's processes
(:mod:`.agents`), the rings it left (:mod:`.ringsleft`) and the stop signals
(:mod:`.signals`)."""
