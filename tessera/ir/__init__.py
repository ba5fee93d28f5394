"""Stage `ir`: the graph IR shared by operator and primitive graphs."""
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType
from tessera.ir.prims import Category, Prim

__all__ = ["Category", "DType", "Graph", "GraphKind", "Node", "Prim", "TensorType"]
