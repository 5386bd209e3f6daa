"""Expert review of ILS pairs and CheXpercept items: the database, importers, statistics, export and web app.

``db`` (SQLite, WAL; users with hashed tokens, items, assignments, decisions), ``importers`` (ILS dataset or
benchmark → items), ``stats`` (acceptance, Cohen's and Fleiss' κ, Dice), ``export`` (``decisions.csv`` for
``percept build --review``, corrected masks, the ILS card's review section) and ``app`` (the FastAPI web app;
needs the ``serve`` extra).
"""
