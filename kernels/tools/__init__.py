"""Book tooling: keeping setup cells and badges in sync (:mod:`.booktools`), showing source
(:mod:`.source`), the figures' shared style (:mod:`.style`)."""
