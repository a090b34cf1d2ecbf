//! The built-in block algorithms. Each file wraps one well-kept crate behind the
//! [`Codec`](crate::Codec) trait; ids are permanent (see `docs/FORMAT.md`).

mod deflate;
mod lz4;
mod lzo;
mod lzo1x1;
mod lzw;
mod none;
mod quicklz;
mod zstd;

pub use deflate::{Gzip, Zlib};
pub use lz4::Lz4;
pub use lzo::Lzo;
pub use lzw::Lzw;
pub use none::NoCompression;
pub use quicklz::QuickLz;
pub use zstd::Zstd;
