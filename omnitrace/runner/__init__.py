"""What `omnitrace run` does around its command, as a library: the command's
environment and its run beside the agent (:mod:`.command`), the agent's processes
(:mod:`.agents`), the rings it left (:mod:`.ringsleft`) and the stop signals
(:mod:`.signals`)."""
