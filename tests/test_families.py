"""A model family is one object per layer: each layer's registry (lib/*/families.py) holds a class for each
family, and nothing else in lib/ branches on which family a task or a model is."""

import ast
from tests.conftest import ROOT

FAMILY_NAMES = {"seq2seq", "lm"}
FAMILY_MODELS = {"Transformer", "TransformerLM", "Translator", "LanguageModel"}  # a family told by its model


def family_branches(tree: ast.Module) -> list[tuple[int, str]]:
    """Where code tells one family from another: a comparison with a family's name, a table keyed by them, an
    isinstance of a family's model, a config probed for an attribute (hasattr(cfg, ...))."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            found += [(node.lineno, f"compares with {side.value!r}") for side in (node.left, *node.comparators)
                      if isinstance(side, ast.Constant) and side.value in FAMILY_NAMES]
        elif isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in FAMILY_NAMES
                                                for k in node.keys):
            found.append((node.lineno, "a table keyed by family"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 2:
            probed = node.args[0]
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            named = {getattr(kind, "id", getattr(kind, "attr", "")) for kind in kinds}
            if node.func.id == "isinstance" and named & FAMILY_MODELS:
                found.append((node.lineno, "isinstance of a family's model"))
            elif node.func.id == "hasattr" and "cfg" in getattr(probed, "id", ""):
                found.append((node.lineno, "a config probed with hasattr"))
    return found


def test_nothing_in_lib_branches_on_the_model_family_outside_the_registries():
    branches = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in sorted((ROOT / "lib").rglob("*.py"))
                if path.name != "families.py" for line, what in family_branches(ast.parse(path.read_text()))]
    assert branches == []


def test_the_search_finds_each_kind_of_branch():
    code = ('if task.family == "lm": pass\nLR = {"seq2seq": 1, "lm": 2}\nisinstance(model, LanguageModel)\n'
            'hasattr(cfg, "label_smoothing")\nhasattr(model, "no_sync")\n')
    assert [what for _, what in family_branches(ast.parse(code))] == [
        "compares with 'lm'", "a table keyed by family", "isinstance of a family's model",
        "a config probed with hasattr"]


def test_every_layer_has_an_object_for_every_family():
    from lib.core.families import FAMILIES
    from lib.evaluate.families import EVALUATIONS
    from lib.report.families import REPORTING
    from lib.tasks import get_task, task_names
    from lib.train.families import TRAINING
    from lib.use.families import USES

    registries = {"lib.core": FAMILIES, "lib.train": TRAINING, "lib.evaluate": EVALUATIONS,
                  "lib.report": REPORTING, "lib.use": USES}
    assert {layer: set(registry) for layer, registry in registries.items()} == {
        layer: FAMILY_NAMES for layer in registries}
    assert {get_task(name).family for name in task_names()} == FAMILY_NAMES
    assert all(family.name == name for registry in registries.values() for name, family in registry.items())
    assert sorted(path.parent.name for path in (ROOT / "lib").rglob("families.py")) == sorted(
        layer.split(".")[1] for layer in registries)
