"""The report of a state dir, offline (python -m validator report): summary.py reads the
journal and the records, html.py draws the page, cli.py is the command. The loop never imports
it; it reads what the loop wrote.
"""
