"""The committed stubs in mmrl_proto/v1 are exactly what grpcio-tools generates from protos/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_generated_stubs_match_the_protos(tmp_path: Path) -> None:
    protos = sorted((ROOT / "protos").glob("mmrl_proto/v1/*.proto"))
    assert protos, "no .proto files found"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "protos"),
         f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}",
         *map(str, protos)],
        check=True,
    )
    generated = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*.py*")}
    committed = {
        p.relative_to(ROOT): p.read_bytes()
        for p in (ROOT / "mmrl_proto" / "v1").glob("*_pb2*.py*")
    }
    assert set(generated) == set(committed), "run `make protos`: stub files differ"
    stale = [str(name) for name, data in generated.items() if committed[name] != data]
    assert not stale, f"stale generated stubs (run `make protos`): {stale}"


def test_every_service_is_in_package_mmrl_v1() -> None:
    protos = sorted((ROOT / "protos" / "mmrl_proto" / "v1").glob("*.proto"))
    assert protos
    for proto in protos:
        assert "package mmrl.v1;" in proto.read_text(), proto


def test_a_trajectory_keeps_its_segment_count_over_the_wire_and_an_old_sender_means_one() -> None:
    from mmrl_proto.v1 import common_pb2
    from services.common.trajectory import Trajectory

    cut = Trajectory("e-t1", (1, 2), (0, 1), (0.0, -0.5), (0.0, 1.0), segments=3)
    assert Trajectory.from_proto(cut.to_proto()).segments == 3
    assert Trajectory.from_proto(common_pb2.Trajectory(trajectory_id="old", token_ids=[1])).segments == 1
    with pytest.raises(ValueError, match="segments"):
        Trajectory("e", (1, 2), (0, 1), (0.0, -0.5), (0.0, 1.0), segments=0).validate()
