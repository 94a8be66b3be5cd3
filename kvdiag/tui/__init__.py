"""The Textual viewer (``kvdiag tui``): the only package that imports textual.

Its non-widget modules (document, rows, eventtext, fitsdetail, pagestext, sparkline, crashes,
summaries, navigation, rowsource) import only rich and kvdiag, so they can be tested and reused
without a terminal; widgets/, screens/, app.py and messages.py are the Textual part.
"""
