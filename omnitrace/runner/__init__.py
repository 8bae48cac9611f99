"""What `omnitrace run` does around its command, as a library: the agent's processes
(:mod:`.agents`) and the rings it left (:mod:`.ringsleft`)."""
