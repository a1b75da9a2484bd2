"""A python command line as python reads it (``argv``) and the dry run's check that the ranks' python
finds ``--preload``'s modules (``find``). The helper and its forks are ``xrun.launch.preload``.
"""
