"""Hook definitions shipped with omnitrace, one package per target, one module per version
range (``TARGET``, ``VERSIONS``, ``HOOKS``); applied by :mod:`omnitrace.inject.patching`.

In the source tree this is the top-level ``patches/`` directory; installed, it is the
``omnitrace.patches`` package. ``omnitrace run --patches DIR`` adds your own modules of the
same shape, which win over these for a version both know.
"""
