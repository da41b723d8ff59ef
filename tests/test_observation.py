"""Observations: a hand-built scene read back from the text, the structured dict and the image."""

from __future__ import annotations

import io

import crafter
import numpy as np
import pytest
from crafter import objects
from PIL import Image
from support.worlds import clear_around

from task_app.game import Game, GameEnv, WorldFactory
from task_app.game.actions import plan_from_names
from task_app.game.observation import SEMANTIC_IDS, SEMANTIC_NAMES, direction_text, nearest

# (dx, dy) -> what is there; dx grows to the right, dy grows downwards.
SCENE = {
    (1, 0): "stone",
    (-4, -3): "water",  # top-left corner of the 9x7 view
    (0, 3): "tree",  # bottom row, centre column
    (4, 3): "coal",  # bottom-right corner
    (-2, 1): "iron",
}
COW_AT = (2, -1)
SYMBOL = {"stone": "#", "water": "~", "tree": "T", "coal": "c", "iron": "i", "cow": "C"}
MAP_HEADER = "Map around you (9 wide, 7 high; top row is up/north, left column is left/west; you are @):"
STRUCTURED_KEYS = {
    "inventory",
    "achievements_status",
    "achievements_counts",
    "player_position",
    "player_direction",
    "semantic_map_patch7",
    "num_steps_taken",
    "max_steps_episode",
    "terminated",
    "truncated",
}


@pytest.fixture
def scene(worlds: WorldFactory) -> GameEnv:
    """Seed 2's world, with grass all around the player and known things at known offsets."""
    env = worlds.world(2)
    clear_around(env, 12)
    x, y = int(env.player.pos[0]), int(env.player.pos[1])
    for (dx, dy), material in SCENE.items():
        env.world[x + dx, y + dy] = material
    env.world.add(objects.Cow(env.world, (x + COW_AT[0], y + COW_AT[1])))
    env.player.facing = (1, 0)
    return env


def _map_rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = lines.index(MAP_HEADER) + 1
    return [line.split(" ") for line in lines[start : start + 7]]


def _line(text: str, prefix: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(prefix))


def test_semantic_ids_are_crafters() -> None:
    """Our ids are the ones crafter's own SemanticView writes into the map, for every material and object."""
    env = crafter.Env(area=(16, 16), seed=0)
    env.reset()
    view = env._sem_view
    objects = {kind.__name__.lower(): index for kind, index in view._obj_ids.items()}
    assert {name: SEMANTIC_IDS[name] for name in view._mat_ids if name is not None} == {
        name: index for name, index in view._mat_ids.items() if name is not None
    }
    assert {name: SEMANTIC_IDS[name] for name in objects} == objects
    assert set(SEMANTIC_NAMES) == {"none", *view._mat_ids.keys() - {None}, *objects}
    assert view()[tuple(env._player.pos)] == SEMANTIC_IDS["player"]


def test_map_is_printed_top_down_with_x_across(scene: GameEnv) -> None:
    rows = _map_rows(Game(scene).observe().text)
    expected = [["."] * 9 for _ in range(7)]
    expected[3][4] = "@"
    for (dx, dy), material in SCENE.items():
        expected[dy + 3][dx + 4] = SYMBOL[material]
    expected[COW_AT[1] + 3][COW_AT[0] + 4] = "C"
    assert rows == expected
    # spelled out, for the reader: stone right of @, water in the top-left corner, tree straight below
    assert rows[3][5] == "#" and rows[0][0] == "~" and rows[6][4] == "T" and rows[2][6] == "C"


def test_text_says_what_the_player_faces(scene: GameEnv) -> None:
    text = Game(scene).observe().text
    x, y = int(scene.player.pos[0]), int(scene.player.pos[1])
    assert _line(text, "Position:") == f"Position: x={x}, y={y}; facing right, the tile in front of you is stone"
    scene.player.facing = (0, 1)
    assert _line(Game(scene).observe().text, "Position:").endswith("facing down, the tile in front of you is grass")
    scene.player.facing = (0, -1)
    scene.world[x, y - 1] = "water"
    assert _line(Game(scene).observe().text, "Position:").endswith("facing up, the tile in front of you is water")
    scene.player.facing = (-1, 0)
    scene.world[x - 1, y] = "table"
    assert _line(Game(scene).observe().text, "Position:").endswith("facing left, the tile in front of you is table")


def test_nearest_lines_give_direction_and_distance(scene: GameEnv) -> None:
    text = Game(scene).observe().text
    assert "- stone: 1 right (1 step)" in text
    assert "- tree: 3 down (3 steps)" in text
    assert "- water: 4 left, 3 up (7 steps)" in text
    assert "- coal: 4 right, 3 down (7 steps)" in text
    assert "- iron: 2 left, 1 down (3 steps)" in text
    assert "- cow: 2 right, 1 up (3 steps)" in text
    missing = _line(text, "- not on the map:")
    assert "zombie" in missing and "skeleton" in missing and "plant" in missing
    assert "tree" not in missing
    assert _line(text, "Legend:").startswith("Legend: @ you, ~ water, . grass")


def test_nearest_after_moving_towards_it(scene: GameEnv) -> None:
    game = Game(scene)
    _, observation = game.step(plan_from_names(["move_down", "move_down"], 8))
    assert "- tree: 1 down (1 step)" in observation.text
    assert _line(observation.text, "Position:").endswith("facing down, the tile in front of you is tree")
    _, observation = game.step(plan_from_names(["do"], 8))
    assert "Inventory: wood 1" in observation.text
    assert "Achievements (1/22): collect_wood" in observation.text


def test_vitals_inventory_and_flags(scene: GameEnv) -> None:
    scene.player.inventory.update(food=4, wood=3, sapling=1, wood_pickaxe=1)
    scene.player.achievements["place_table"] = 2
    scene.world.daylight = 0.2
    scene.player.sleeping = True
    text = Game(scene).observe().text
    assert text.splitlines()[0] == "Step 0/10000, night, you are asleep"
    assert _line(text, "Vitals:") == "Vitals: health 9/9, food 4/9, drink 9/9, energy 9/9"
    assert _line(text, "Inventory:") == "Inventory: sapling 1, wood 3, wood_pickaxe 1"
    assert _line(text, "Achievements") == "Achievements (1/22): place_table"


def test_end_of_episode_lines(worlds: WorldFactory) -> None:
    game = Game(worlds.world(2))
    assert "You died" not in game.observe().text
    game.terminated = True
    assert "You died. The episode is over." in game.observe().text
    assert game.observe().data["terminated"] is True
    game.terminated, game.truncated = False, True
    assert "The episode has reached its length limit." in game.observe().text
    assert game.observe().data["truncated"] is True


def test_edge_of_the_world(scene: GameEnv) -> None:
    scene.world.move(scene.player, (0, 1))
    scene.player.facing = (-1, 0)
    observation = Game(scene).observe()
    rows = _map_rows(observation.text)
    assert rows[0] == ["X"] * 9 and rows[1] == ["X"] * 9  # y = -2, -1
    assert all(row[:4] == ["X"] * 4 for row in rows)  # x = -4 .. -1
    assert rows[3][4] == "@"
    assert "the tile in front of you is the edge of the world" in observation.text
    assert "X outside" in _line(observation.text, "Legend:")
    patch = observation.data["semantic_map_patch7"]
    assert patch[0] == [0] * 7 and patch[1] == [0] * 7  # rows above the map
    assert all(row[:3] == [0, 0, 0] for row in patch)  # columns left of the map
    assert patch[3][3] == SEMANTIC_IDS["player"]


def test_structured_dict(scene: GameEnv) -> None:
    data = Game(scene).observe().data
    assert set(data) == STRUCTURED_KEYS
    assert set(data["inventory"]) >= {"health", "food", "drink", "energy", "wood", "stone", "iron_sword"}
    assert len(data["achievements_status"]) == 22 and not any(data["achievements_status"].values())
    assert data["achievements_counts"] == dict.fromkeys(data["achievements_status"], 0)
    assert data["player_position"] == [int(v) for v in scene.player.pos]
    assert data["player_direction"] == [1, 0]
    assert (data["num_steps_taken"], data["max_steps_episode"]) == (0, 10_000)
    assert data["terminated"] is False and data["truncated"] is False
    # wire-ready: plain Python values only
    for value in data.values():
        assert type(value) in (dict, list, int, bool)


def test_semantic_patch_is_row_dy_column_dx(scene: GameEnv) -> None:
    patch = Game(scene).observe().data["semantic_map_patch7"]
    assert len(patch) == 7 and all(len(row) == 7 for row in patch)
    assert patch[3][3] == SEMANTIC_IDS["player"]
    assert patch[3][4] == SEMANTIC_IDS["stone"]  # dx = +1, dy = 0
    assert patch[4][1] == SEMANTIC_IDS["iron"]  # dx = -2, dy = +1
    assert patch[2][5] == SEMANTIC_IDS["cow"]  # dx = +2, dy = -1
    assert patch[6][3] == SEMANTIC_IDS["tree"]  # dx = 0, dy = +3
    semantic = scene.semantic()
    x, y = int(scene.player.pos[0]), int(scene.player.pos[1])
    assert patch == [[int(semantic[x + dx, y + dy]) for dx in range(-3, 4)] for dy in range(-3, 4)]


def test_counts_and_steps_follow_the_game(worlds: WorldFactory) -> None:
    game = Game(worlds.world(2, (64, 64), 300))
    _, observation = game.step(plan_from_names(["noop", "noop", "move_left"], 8))
    assert observation.data["num_steps_taken"] == 3
    assert observation.data["max_steps_episode"] == 300
    assert observation.data["player_direction"] == [-1, 0]
    assert observation.text.startswith("Step 3/300, day")


def test_no_image_unless_asked(worlds: WorldFactory) -> None:
    observation = Game(worlds.world(2)).observe()
    assert observation.image_png is None
    assert observation.image_base64 is None and observation.image_data_url is None
    assert not any(key.startswith("observation_image") for key in observation.data)


@pytest.mark.parametrize("size", [64, 96])
def test_image_when_asked(worlds: WorldFactory, size: int) -> None:
    observation = Game(worlds.world(2), image_size=size).observe()
    assert observation.image_png is not None and observation.image_png.startswith(b"\x89PNG")
    image = Image.open(io.BytesIO(observation.image_png))
    assert image.format == "PNG" and image.size == (size, size) and image.mode == "RGB"
    assert observation.data["observation_image_format"] == "png"
    assert observation.data["observation_image_width"] == observation.data["observation_image_height"] == size
    assert observation.image_data_url is not None
    assert observation.image_data_url.startswith("data:image/png;base64,")
    assert set(observation.data) - STRUCTURED_KEYS == {
        "observation_image_format",
        "observation_image_width",
        "observation_image_height",
    }


def test_image_shows_what_stock_crafter_shows(worlds: WorldFactory) -> None:
    stock = crafter.Env(seed=2)
    stock_frame = stock.reset()
    observation = Game(worlds.world(2), image_size=64).observe()
    ours = np.asarray(Image.open(io.BytesIO(observation.image_png or b"")).convert("RGB"))
    assert np.array_equal(ours, stock_frame)


@pytest.mark.parametrize(
    ("dx", "dy", "text"),
    [(0, 0, "here"), (2, 0, "2 right"), (-1, 0, "1 left"), (0, -3, "3 up"), (-2, 5, "2 left, 5 down")],
)
def test_direction_text(dx: int, dy: int, text: str) -> None:
    assert direction_text(dx, dy) == text


def test_nearest_is_the_first_of_the_closest_cells_in_x_major_order() -> None:
    """The compiled pass against the plain definition, on random maps with ties and absent kinds."""
    rng = np.random.RandomState(0)
    kinds = SEMANTIC_NAMES[:6]  # none, water, grass, stone, path, sand
    for _ in range(300):
        shape = (int(rng.randint(1, 20)), int(rng.randint(1, 20)))
        semantic = rng.randint(0, len(kinds), size=shape).astype(np.uint8)
        pos = (int(rng.randint(shape[0])), int(rng.randint(shape[1])))
        expected = {}
        for kind in kinds:
            cells = [
                (abs(x - pos[0]) + abs(y - pos[1]), x, y)
                for x in range(shape[0])
                for y in range(shape[1])
                if semantic[x, y] == SEMANTIC_IDS[kind] and (x, y) != pos
            ]
            if cells:
                _, x, y = min(cells)
                expected[kind] = (x - pos[0], y - pos[1])
        assert nearest(semantic, pos, kinds) == expected


def test_semantic_map_is_crafters_semantic_view(worlds: WorldFactory) -> None:
    env = worlds.world(5)
    rng = np.random.RandomState(5)
    for step in range(300):
        env.step(int(rng.randint(len(crafter.constants.actions))))
        if step % 50 == 0:
            assert np.array_equal(env.semantic(), env._sem_view())
    assert np.array_equal(env.semantic(), env._sem_view())
