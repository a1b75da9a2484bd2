"""The directory a rank's ``PYTHONPATH`` gains (``endpoints.SITE_DIR``): its ``sitecustomize`` starts the rank's
telemetry endpoint. A package so that the wheel carries it (``find_packages`` skips a folder without this file,
which left every non-editable install without ``sitecustomize``: issue 37) and so that the preload helper can import
it as ``xrun.launch.telemetry.site.sitecustomize``; on ``PYTHONPATH`` only the ``sitecustomize`` module matters.
"""
