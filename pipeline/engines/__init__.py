"""Merge engines (see the map in docs/DESIGN.md once written): ``local`` runs on the driver,
``block``/``planner``/``rounds``/``spark`` run distributed merge rounds."""
