"""The rules the live agent and the offline report share: the span object, TTFP
attribution (the reference walk and the batch walk), head-of-line blocking in wall time,
and span objects from span rows. Below ``analyze`` and ``agent``: the agent's live views
apply the report's rules without importing the report."""
