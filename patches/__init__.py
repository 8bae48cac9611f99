"""Hook definitions shipped with omnitrace, one package per target, one module per version
range (``TARGET``, ``VERSIONS``, ``HOOKS``); applied by :mod:`omnitrace.inject.patching`.

``omnitrace run --patches DIR`` adds your own modules of the same shape, which win over
these for a version both know.
"""
