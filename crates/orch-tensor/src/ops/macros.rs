//! The macros that turn one table entry per elementwise op (ops/table.rs) into its enum variant,
//! name, CPU kernel, CUDA kernel (name and source) and gradient rule.
//!
//! Every part of an entry is required by the macro's grammar, so an op without a CPU kernel, a
//! CUDA expression or a gradient rule does not compile. An op that has no gradient says so with
//! `none` (comparisons, the backward helpers): a declaration, not a fallback.

/// One side of a binary op's gradient rule: `none`, or a block giving the gradient with respect to
/// that side, in the output's shape (broadcasting is undone by the caller).
macro_rules! binary_side {
    (none) => {
        Ok(None)
    };
    ({ $($rule:tt)* }) => {
        Ok(Some({ $($rule)* }))
    };
}

/// Whether a side of a binary op's rule is declared.
macro_rules! binary_side_declared {
    (none) => {
        false
    };
    ({ $($rule:tt)* }) => {
        true
    };
}

/// Declares the unary elementwise ops. Entry grammar:
///
/// ```text
/// Variant { param, .. } => "name",
///     cpu |v| <f32 expression>,
///     cuda "<CUDA C expression of v, p0, p1>",
///     grad |x, y, g| <Result<Tensor>: the input's gradient from input x, output y, upstream g>;
/// ```
///
/// Parameters are f32 fields; the CUDA kernel receives them as `p0`, `p1` (in order). The CUDA
/// kernel is named `u_<name>` and generated from the expression (`UNARY` in kernels.cu).
macro_rules! unary_ops {
    ($(
        $(#[$doc:meta])*
        $variant:ident $({ $($param:ident),+ })? => $name:literal,
            cpu |$v:ident| $cpu:expr,
            cuda $cuda:literal,
            grad |$x:ident, $y:ident, $g:ident| $grad:expr;
    )*) => {
        /// Elementwise maps of one tensor (the table in ops/table.rs).
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub(crate) enum UnaryOp {
            $( $(#[$doc])* $variant $({ $($param: f32),+ })?, )*
        }

        impl UnaryOp {
            /// The CUDA kernel of every unary op.
            pub(crate) const KERNELS: &'static [&'static str] = &[$(concat!("u_", $name)),*];

            /// The CUDA source of every unary kernel (appended to kernels.cu before NVRTC).
            pub(crate) const CUDA_SOURCE: &'static str =
                concat!($("UNARY(u_", $name, ", (", $cuda, "))\n"),*);

            /// The op's name in errors.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(UnaryOp::$variant { .. } => $name,)*
                }
            }

            /// The op's CUDA kernel.
            pub(crate) fn kernel(self) -> &'static str {
                match self {
                    $(UnaryOp::$variant { .. } => concat!("u_", $name),)*
                }
            }

            /// The op's scalar parameters in order, as the CUDA kernel takes them (unused: 0).
            pub(crate) fn params(self) -> [f32; 2] {
                match self {
                    $(UnaryOp::$variant $({ $($param),+ })? => {
                        let given: &[f32] = &[$($($param),+)?];
                        [
                            given.first().copied().unwrap_or(0.0),
                            given.get(1).copied().unwrap_or(0.0),
                        ]
                    })*
                }
            }

            /// The CPU kernel over a dense slice (one monomorphised loop per op).
            pub(crate) fn cpu(self, x: &[f32]) -> crate::cpu::CpuStorage {
                match self {
                    $(UnaryOp::$variant $({ $($param),+ })? => {
                        crate::cpu::map(x, |$v: f32| -> f32 { $cpu })
                    })*
                }
            }

            /// The gradient with respect to the input `x`, given the output `y` and the upstream
            /// gradient `g`. Runs with recording off.
            #[allow(unused_variables)]
            pub(crate) fn grad(self, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Tensor> {
                match self {
                    $(UnaryOp::$variant $({ $($param),+ })? => {
                        let ($x, $y, $g) = (x, y, g);
                        $grad
                    })*
                }
            }
        }
    };
}

/// Declares the binary elementwise ops (numpy broadcasting). Entry grammar:
///
/// ```text
/// Variant => "name",
///     cpu |l, r| <f32 expression>,
///     cuda "<CUDA C expression of x (left) and z (right)>",
///     grad |a, b, y, g| lhs: { <Tensor expression> } or none, rhs: { .. } or none;
/// ```
///
/// A side's rule gives the gradient in the output's shape; the autograd layer sums it down to
/// that input's shape. The CUDA kernels are `b_<name>_contig` and `b_<name>_strided`, generated
/// from the expression (`BINARY` in kernels.cu).
macro_rules! binary_ops {
    ($(
        $(#[$doc:meta])*
        $variant:ident => $name:literal,
            cpu |$l:ident, $r:ident| $cpu:expr,
            cuda $cuda:literal,
            grad |$a:ident, $b:ident, $y:ident, $g:ident| lhs: $lhs:tt, rhs: $rhs:tt;
    )*) => {
        /// Elementwise maps of two broadcast tensors (the table in ops/table.rs).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum BinaryOp {
            $( $(#[$doc])* $variant, )*
        }

        impl BinaryOp {
            /// The CUDA kernels of every binary op (dense and strided variants).
            pub(crate) const KERNELS: &'static [&'static str] =
                &[$(concat!("b_", $name, "_contig"), concat!("b_", $name, "_strided")),*];

            /// The CUDA source of every binary kernel (appended to kernels.cu before NVRTC).
            pub(crate) const CUDA_SOURCE: &'static str =
                concat!($("BINARY(b_", $name, ", (", $cuda, "))\n"),*);

            /// The op's name in errors.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(BinaryOp::$variant => $name,)*
                }
            }

            /// The op's CUDA kernel for dense or strided operands.
            pub(crate) fn kernel(self, dense: bool) -> &'static str {
                match (self, dense) {
                    $(
                        (BinaryOp::$variant, true) => concat!("b_", $name, "_contig"),
                        (BinaryOp::$variant, false) => concat!("b_", $name, "_strided"),
                    )*
                }
            }

            /// Whether a gradient flows to the left and to the right operand.
            pub(crate) fn differentiable(self) -> (bool, bool) {
                match self {
                    $(BinaryOp::$variant => (
                        binary_side_declared!($lhs),
                        binary_side_declared!($rhs),
                    ),)*
                }
            }

            /// The CPU kernel over two layouts broadcast to one shape.
            pub(crate) fn cpu(
                self,
                a: &[f32],
                la: &crate::layout::Layout,
                b: &[f32],
                lb: &crate::layout::Layout,
            ) -> crate::cpu::CpuStorage {
                match self {
                    $(BinaryOp::$variant => {
                        crate::cpu::zip_map(a, la, b, lb, |$l: f32, $r: f32| -> f32 { $cpu })
                    })*
                }
            }

            /// The gradient with respect to the left operand `a` (output's shape), or `None`
            /// where the table declares none.
            #[allow(unused_variables)]
            pub(crate) fn grad_lhs(
                self,
                a: &Tensor,
                b: &Tensor,
                y: &Tensor,
                g: &Tensor,
            ) -> Result<Option<Tensor>> {
                match self {
                    $(BinaryOp::$variant => {
                        let ($a, $b, $y, $g) = (a, b, y, g);
                        binary_side!($lhs)
                    })*
                }
            }

            /// As [`BinaryOp::grad_lhs`], for the right operand.
            #[allow(unused_variables)]
            pub(crate) fn grad_rhs(
                self,
                a: &Tensor,
                b: &Tensor,
                y: &Tensor,
                g: &Tensor,
            ) -> Result<Option<Tensor>> {
                match self {
                    $(BinaryOp::$variant => {
                        let ($a, $b, $y, $g) = (a, b, y, g);
                        binary_side!($rhs)
                    })*
                }
            }
        }
    };
}
