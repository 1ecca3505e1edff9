"""``loadgen map``: where a deployment is safe, where history decides, where it cannot drain.

grid.py plans the points (rate x trigger factor x controller x seed) and their specs; run.py
simulates each in memory and keeps one outcome row (outcomes.parquet), with resume; bisect.py
searches the minimal tipping trigger; bounds.py computes the two analytic bounds; analysis.py
turns rows into probabilities, boundaries, escape times and controller gains; report.py writes
map.json and the text report; figures.py draws them. Ray execution lives in actors/map.py.
Nothing is imported here, so that the CLI can read the grid defaults without loading pyarrow.
"""
