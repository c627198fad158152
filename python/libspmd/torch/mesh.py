"""Meshes with torch_xla.distributed.spmd's names and semantics.

A Mesh is a logical arrangement of libspmd devices: the device at mesh
coordinate c is ``device_ids[row_major(c)]``, as libspmd's own meshes
(docs/DESIGN.md, "Mesh").  A HybridMesh also records which axes cross
processes (dcn) and which stay inside one (ici).

Under ``mpirun -n P`` a mesh's devices are spread over the P processes by
libspmd's layout rule: the device at row-major mesh position r runs in
process r / (N / P), so the minor axes stay inside a process.
"""
from collections import OrderedDict
import os

import numpy as np

from ..errors import InvalidError

_device_count = None
_global_mesh = None


def set_device_count(n):
    """Set how many libspmd devices get_1d_mesh and HybridMesh lay out."""
    n = int(n)
    if n < 1:
        raise InvalidError(f"device count must be positive, got {n}")
    global _device_count
    _device_count = n


def process_count():
    """The processes running this script (torch_xla.runtime's name): mpirun's -n, else 1."""
    import libspmd
    return libspmd.process_count()


def process_index():
    """This process's index, 0 .. process_count() - 1 (torch_xla.runtime's name)."""
    import libspmd
    return libspmd.process_index()


def global_runtime_device_count():
    """The devices a mesh spans by default: set_device_count's, else the CPU count."""
    return _device_count if _device_count is not None else (os.cpu_count() or 1)


class Mesh:
    """torch_xla's Mesh: device_ids (any iterable or NumPy array) laid out
    row-major over mesh_shape, with optional axis names."""

    def __init__(self, device_ids, mesh_shape, axis_names=None):
        if isinstance(device_ids, np.ndarray):
            ids = device_ids.ravel()
        else:
            ids = np.array(list(device_ids)).ravel()
        mesh_shape = tuple(int(d) for d in mesh_shape)
        if any(d < 1 for d in mesh_shape):
            raise InvalidError(f"mesh_shape {mesh_shape}: every axis needs at least one device")
        if axis_names is not None:
            axis_names = tuple(axis_names)
            if len(axis_names) != len(mesh_shape):
                raise InvalidError(f"{len(axis_names)} axis names {axis_names} for a mesh of "
                                   f"{len(mesh_shape)} axes {mesh_shape}")
            for name in axis_names:
                if not isinstance(name, str) or not name.isidentifier():
                    raise InvalidError(f"axis name {name!r} is not an identifier")
            if len(set(axis_names)) != len(axis_names):
                raise InvalidError(f"axis names {axis_names} repeat a name")
        size = int(np.prod(mesh_shape, dtype=np.int64))
        if ids.size != size:
            raise InvalidError(f"{ids.size} device ids for a mesh of shape {mesh_shape} "
                               f"({size} devices)")
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise InvalidError(f"device ids must be integers, got {ids.dtype}")
        ids = ids.astype(np.int64)
        if sorted(ids.tolist()) != list(range(size)):
            raise InvalidError(f"device ids {ids.tolist()} are not a permutation of 0..{size - 1}")
        self.device_ids = ids
        self.mesh_shape = mesh_shape
        self.axis_names = axis_names

    def size(self):
        return int(np.prod(self.mesh_shape, dtype=np.int64))

    def shape(self):
        """OrderedDict axis name (or index, when unnamed) -> size."""
        keys = self.axis_names if self.axis_names is not None else range(len(self.mesh_shape))
        return OrderedDict(zip(keys, self.mesh_shape))

    def get_logical_mesh(self):
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name):
        """The index of axis `name`, None when the mesh has no such axis."""
        if self.axis_names is None or name not in self.axis_names:
            return None
        return self.axis_names.index(name)

    def libspmd_axis_names(self):
        """The axis names libspmd uses: the given ones, else axis_0, axis_1, ..."""
        if self.axis_names is not None:
            return self.axis_names
        return tuple(f"axis_{i}" for i in range(len(self.mesh_shape)))

    def dcn_axes(self):
        """Indices of the axes whose groups cross processes (none for a plain Mesh)."""
        return ()

    def __eq__(self, other):
        return (isinstance(other, Mesh) and self.mesh_shape == other.mesh_shape
                and self.axis_names == other.axis_names
                and np.array_equal(self.device_ids, other.device_ids)
                and self.dcn_axes() == other.dcn_axes())

    def __hash__(self):
        return hash((self.mesh_shape, self.axis_names, tuple(self.device_ids.tolist())))

    def __repr__(self):
        return (f"Mesh(device_ids={self.device_ids.tolist()}, mesh_shape={self.mesh_shape}, "
                f"axis_names={self.axis_names})")


class HybridMesh(Mesh):
    """torch_xla's HybridMesh: ici_mesh_shape inside each process (a slice),
    dcn_mesh_shape across processes; the mesh shape is their elementwise
    product, the dcn part of each axis the major one.  Slice s holds devices
    s*k .. s*k + k-1 (k the ici size), laid out as the ici mesh in its block
    of the mesh, as torch_xla lays slices.

    Under mpirun -n P (P > 1) slice s is process s: P must be the number of
    slices, and since process p runs the devices at row-major mesh positions
    p*k .. p*k + k-1, the dcn axes must be the major ones (no axis before
    the last one with dcn > 1 may have ici > 1), so that the axes with
    dcn > 1 are exactly those that cross processes.  Otherwise ValueError,
    naming both shapes.  In one process any shapes run: every device is a
    thread of it, with the bits of the run over P processes."""

    def __init__(self, *, ici_mesh_shape, dcn_mesh_shape=None, axis_names=None):
        ici = tuple(int(d) for d in ici_mesh_shape)
        dcn = tuple(int(d) for d in dcn_mesh_shape) if dcn_mesh_shape is not None else (1,) * len(ici)
        if len(ici) != len(dcn):
            raise InvalidError(f"ici_mesh_shape {ici} and dcn_mesh_shape {dcn} have different ranks")
        if not ici or any(d < 1 for d in ici + dcn):
            raise InvalidError(f"ici_mesh_shape {ici}, dcn_mesh_shape {dcn}: need at least one "
                               f"axis, every size positive")
        shape = tuple(i * d for i, d in zip(ici, dcn))
        coords = np.indices(shape).reshape(len(shape), -1)
        slice_of = np.ravel_multi_index(tuple(c // i for c, i in zip(coords, ici)), dcn)
        within = np.ravel_multi_index(tuple(c % i for c, i in zip(coords, ici)), ici)
        ids = slice_of * int(np.prod(ici)) + within
        super().__init__(ids, shape, axis_names)
        self.ici_mesh_shape = ici
        self.dcn_mesh_shape = dcn
        self._check_processes(process_count())

    def _check_processes(self, processes):
        """The slices must be the processes of a run over several."""
        if processes == 1:
            return
        shapes = f"HybridMesh(ici_mesh_shape={self.ici_mesh_shape}, dcn_mesh_shape={self.dcn_mesh_shape})"
        slices = int(np.prod(self.dcn_mesh_shape))
        if slices != processes:
            raise InvalidError(f"{shapes}: the dcn shape asks for {slices} processes (one per slice), "
                               f"but mpirun started {processes}")
        if not np.array_equal(self.device_ids, np.arange(self.size())):
            k = int(np.prod(self.ici_mesh_shape))
            raise InvalidError(f"{shapes} over {processes} processes: process p runs the devices at "
                               f"row-major mesh positions {k}p .. {k}p + {k - 1}, so the dcn axes must "
                               f"be the major ones (an axis before the last one with dcn > 1 must have "
                               f"ici size 1)")

    def dcn_axes(self):
        return tuple(i for i, d in enumerate(self.dcn_mesh_shape) if d > 1)

    def __repr__(self):
        return (f"HybridMesh(ici_mesh_shape={self.ici_mesh_shape}, "
                f"dcn_mesh_shape={self.dcn_mesh_shape}, axis_names={self.axis_names})")


def get_1d_mesh(axis_name=None):
    """All devices along one axis."""
    n = global_runtime_device_count()
    return Mesh(np.arange(n), (n,), (axis_name,) if axis_name is not None else None)


def set_global_mesh(mesh):
    if not isinstance(mesh, Mesh):
        raise TypeError(f"set_global_mesh takes a Mesh, got {type(mesh).__name__}")
    global _global_mesh
    _global_mesh = mesh


def get_global_mesh():
    """The mesh set_global_mesh set, None when none was."""
    return _global_mesh
