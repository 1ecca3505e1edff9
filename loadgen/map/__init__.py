"""``loadgen map``: where a deployment is safe, where history decides, where it cannot drain.

grid.py plans the points (rate x trigger factor x controller x seed) and their specs; run.py
simulates each in memory and keeps one outcome row (outcomes.parquet), with resume; bisect.py
searches the minimal tipping trigger; bounds.py computes the two analytic bounds; analysis.py
turns rows into probabilities, boundaries, escape times and controller gains; report.py writes
map.json and the text report; figures.py draws them. Ray execution lives in actors/map.py.
"""

from .bounds import MapBounds, spec_bounds
from .grid import GridError, MapGrid, MapJob, MapPoint, map_job, parse_controllers, parse_values, point_spec
from .report import summarize_map, write_map
from .run import OUTCOMES_FILE, OutcomeStore, process_pool, run_in_process, run_map, run_point

__all__ = ["MapBounds", "spec_bounds", "GridError", "MapGrid", "MapJob", "MapPoint", "map_job", "parse_controllers",
           "parse_values", "point_spec", "summarize_map", "write_map", "OUTCOMES_FILE", "OutcomeStore",
           "process_pool", "run_in_process", "run_map", "run_point"]
