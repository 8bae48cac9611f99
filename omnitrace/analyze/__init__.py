"""Analysis of run directories: TTFP attribution, FIFO residence, head-of-line, compare."""
