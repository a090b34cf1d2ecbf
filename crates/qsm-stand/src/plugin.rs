//! Black-box algorithms loaded from shared libraries, through the C ABI of
//! `plugin/qsm_stand_plugin.h`: the STAND paper's entry point (input, output, NUMA node,
//! allocator, error buffer; bytes written or -1), with a version check, a bound and a kind.
//!
//! This is the only module of the crate with `unsafe`: calling foreign code cannot be
//! otherwise. Each block says what it relies on; what it relies on beyond Rust's own
//! guarantees is the header's contract, which a plugin accepts by exporting its ABI version.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_long, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libloading::Library;

use crate::algo::{Failure, Runner};
use crate::plan::Operation;

/// The ABI version this build speaks.
pub const ABI: u32 = 1;
/// Bytes of the error buffer a plugin may write, NUL included.
pub const ERROR_LEN: usize = 256;
/// Bytes a plugin may take from the allocator per call.
pub const POOL: usize = 16 << 20;

type Allocator = extern "C" fn(usize, c_uint) -> *mut c_void;
type Entry = unsafe extern "C" fn(
    *const u8,
    usize,
    *mut u8,
    usize,
    c_uint,
    Allocator,
    *mut c_char,
) -> c_long;
type Bound = unsafe extern "C" fn(usize) -> usize;
type Version = unsafe extern "C" fn() -> u32;
type Kind = unsafe extern "C" fn() -> *const c_char;

/// A loaded plugin.
#[derive(Debug)]
pub struct Plugin {
    path: PathBuf,
    encode: Entry,
    decode: Entry,
    bound: Bound,
    cipher: bool,
    /// Kept last so the entry points above are never used after it unloads the library:
    /// they are only reachable through `&self`, which cannot outlive it.
    _library: Library,
}

impl Plugin {
    /// Loads the library at `path` and checks its ABI version and entry points.
    pub fn load(path: &Path) -> Result<Plugin, String> {
        let at = || format!("plugin {}", path.display());
        if !path.is_file() {
            return Err(format!("{}: no such file", at()));
        }
        // dlopen searches the library path for a bare name: hand it the file checked above.
        let path = &std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", at()))?;
        // SAFETY: loading runs the library's initialisers, arbitrary code the user chose to
        // run by naming the plugin in a plan; nothing of this process is handed to them.
        let library = unsafe { Library::new(path) }.map_err(|e| format!("{}: {e}", at()))?;
        // SAFETY (each `get`): the types are those the header declares for these names. A
        // library exporting them with other types breaks the contract it states it speaks by
        // returning QSM_STAND_ABI, which is checked first.
        let version: Version = unsafe { symbol(&library, b"qsm_stand_abi\0") }
            .map_err(|e| format!("{}: not a qsm stand plugin ({e})", at()))?;
        // SAFETY: a function of no arguments returning a u32, per the header.
        let v = unsafe { version() };
        if v != ABI {
            return Err(format!("{}: ABI version {v}, this qsm stand speaks {ABI}", at()));
        }
        let missing = |e: String| format!("{}: {e}", at());
        let encode: Entry = unsafe { symbol(&library, b"qsm_stand_encode\0") }.map_err(missing)?;
        let decode: Entry = unsafe { symbol(&library, b"qsm_stand_decode\0") }.map_err(missing)?;
        let bound: Bound = unsafe { symbol(&library, b"qsm_stand_bound\0") }.map_err(missing)?;
        let cipher = match unsafe { symbol::<Kind>(&library, b"qsm_stand_kind\0") } {
            Err(_) => false,
            Ok(kind) => {
                // SAFETY: per the header, a pointer to a NUL-terminated string that stays
                // valid while the library is loaded (a literal), or NULL.
                let name = unsafe { kind() };
                if name.is_null() {
                    return Err(format!("{}: qsm_stand_kind returned NULL", at()));
                }
                // SAFETY: non-null and NUL-terminated, as above.
                match unsafe { CStr::from_ptr(name) }.to_bytes() {
                    b"compressor" => false,
                    b"cipher" => true,
                    other => {
                        return Err(format!(
                            "{}: kind {:?}, expected \"compressor\" or \"cipher\"",
                            at(),
                            String::from_utf8_lossy(other)
                        ));
                    }
                }
            }
        };
        Ok(Plugin { path: path.to_owned(), encode, decode, bound, cipher, _library: library })
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it is measured as a cipher (encrypt, decrypt) rather than a compressor.
    pub fn is_cipher(&self) -> bool {
        self.cipher
    }

    fn bound(&self, len: usize) -> usize {
        // SAFETY: a pure function of a size, per the header.
        unsafe { (self.bound)(len) }
    }

    /// Calls `entry` on `input`, writing to `out`, with `pool` as the allocator's memory.
    fn call(
        &self,
        entry: Entry,
        input: &[u8],
        out: &mut [u8],
        node: u32,
        pool: &mut [u8],
    ) -> Result<usize, String> {
        let mut error = [0 as c_char; ERROR_LEN];
        ARENA.with(|a| a.set(Arena { base: pool.as_mut_ptr(), len: pool.len(), used: 0 }));
        // SAFETY: `input` and `out` are valid for reads and writes of exactly the lengths
        // passed, and `error` for ERROR_LEN bytes; the header obliges the plugin to stay
        // within them. `pool` stays mutably borrowed, and untouched by Rust, for the whole
        // call, so the allocator's pointers into it alias nothing Rust can see.
        let n = unsafe {
            entry(
                input.as_ptr(),
                input.len(),
                out.as_mut_ptr(),
                out.len(),
                node,
                pool_alloc,
                error.as_mut_ptr(),
            )
        };
        ARENA.with(|a| a.set(Arena::EMPTY));
        if n < 0 {
            error[ERROR_LEN - 1] = 0;
            // SAFETY: the buffer is NUL-terminated at its last byte at the latest.
            let message = unsafe { CStr::from_ptr(error.as_ptr()) };
            return Err(format!(
                "{} returned {n}: {}",
                self.path.display(),
                message.to_string_lossy()
            ));
        }
        let n = n as usize;
        if n > out.len() {
            return Err(format!(
                "{} claims {n} bytes written into a {}-byte buffer",
                self.path.display(),
                out.len()
            ));
        }
        Ok(n)
    }
}

/// Gets a function pointer by name.
///
/// # Safety
/// `T` must be the symbol's real type.
unsafe fn symbol<T: Copy>(library: &Library, name: &[u8]) -> Result<T, String> {
    let printable = String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name)).into_owned();
    // SAFETY: the caller vouches for `T`.
    unsafe { library.get::<T>(name) }.map(|s| *s).map_err(|e| format!("{printable}: {e}"))
}

/// The memory the allocator hands out during one call, on the calling thread.
#[derive(Clone, Copy)]
struct Arena {
    base: *mut u8,
    len: usize,
    used: usize,
}

impl Arena {
    const EMPTY: Arena = Arena { base: std::ptr::null_mut(), len: 0, used: 0 };
}

thread_local! {
    static ARENA: Cell<Arena> = const { Cell::new(Arena::EMPTY) };
}

/// The allocator passed to plugins: bump allocation from the runner's pool, 16-byte aligned,
/// freed all at once after the call. Outside a call it has no pool and returns NULL.
extern "C" fn pool_alloc(size: usize, _node: c_uint) -> *mut c_void {
    ARENA.with(|a| {
        let mut arena = a.get();
        // Aligned as an address, not as an offset: the pool's own alignment is 1.
        let base = arena.base as usize;
        let start = (base + arena.used).next_multiple_of(16) - base;
        match start.checked_add(size) {
            Some(end) if !arena.base.is_null() && end <= arena.len => {
                arena.used = end;
                a.set(arena);
                // In bounds of the pool (checked above); `wrapping_add` needs no unsafe.
                arena.base.wrapping_add(start).cast()
            }
            _ => std::ptr::null_mut(),
        }
    })
}

/// A plugin measured over a cell's blocks.
pub(crate) struct PluginRunner<'a> {
    plugin: Arc<Plugin>,
    blocks: Vec<&'a [u8]>,
    decoding: bool,
    node: u32,
    encoded: Vec<Vec<u8>>,
    out: Vec<u8>,
    out_len: usize,
    raw: Vec<u8>,
    raw_len: usize,
    pool: Vec<u8>,
}

impl<'a> PluginRunner<'a> {
    pub(crate) fn new(
        plugin: Arc<Plugin>,
        op: Operation,
        blocks: &[&'a [u8]],
        node: u32,
    ) -> Result<Self, Failure> {
        let longest = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
        let bound = plugin.bound(longest);
        if bound > longest.saturating_mul(2).saturating_add(1 << 20) {
            return Err(Failure::Failed(format!(
                "{}: qsm_stand_bound({longest}) = {bound}, more than twice the input and 1 MiB",
                plugin.path.display()
            )));
        }
        let mut r = PluginRunner {
            out: crate::algo::touched(bound),
            plugin,
            blocks: blocks.to_vec(),
            decoding: matches!(op, Operation::Decompress | Operation::Decrypt),
            node,
            encoded: Vec::new(),
            out_len: 0,
            raw: crate::algo::touched(longest),
            raw_len: 0,
            // Touched now, by the thread that makes the runner: that places it.
            pool: crate::algo::touched(POOL),
        };
        for (i, block) in blocks.iter().enumerate() {
            r.encode(i)?;
            let out = &r.out[..r.out_len];
            if r.plugin.cipher && crate::algo::looks_like(out, block) {
                return Err(Failure::Wrong("the ciphertext is the plaintext".into()));
            }
            r.encoded.push(out.to_vec());
        }
        Ok(r)
    }

    fn encode(&mut self, i: usize) -> Result<(), Failure> {
        let p = &self.plugin;
        self.out_len = p
            .call(p.encode, self.blocks[i], &mut self.out, self.node, &mut self.pool)
            .map_err(Failure::Failed)?;
        Ok(())
    }
}

impl Runner for PluginRunner<'_> {
    fn stage(&mut self, i: usize) -> Result<(), Failure> {
        // What the last call left must not pass for this call's output.
        if self.decoding {
            crate::algo::spoil(&mut self.raw, self.blocks[i]);
        } else {
            self.out.fill(0xa5);
        }
        Ok(())
    }

    fn run(&mut self, i: usize) -> Result<(), Failure> {
        if !self.decoding {
            return self.encode(i);
        }
        let p = &self.plugin;
        self.raw_len = p
            .call(p.decode, &self.encoded[i], &mut self.raw, self.node, &mut self.pool)
            .map_err(Failure::Failed)?;
        Ok(())
    }

    fn check(&mut self, i: usize) -> Result<(), Failure> {
        let block = self.blocks[i];
        if !self.decoding {
            let p = &self.plugin;
            let out = &self.out[..self.out_len];
            if p.cipher && crate::algo::looks_like(out, block) {
                return Err(Failure::Wrong("the ciphertext is the plaintext".into()));
            }
            crate::algo::spoil(&mut self.raw, block);
            self.raw_len = p
                .call(p.decode, out, &mut self.raw, self.node, &mut self.pool)
                .map_err(|e| Failure::Wrong(format!("the output does not decode: {e}")))?;
        }
        if &self.raw[..self.raw_len] != block {
            return Err(Failure::Wrong("decoding does not give back the input".into()));
        }
        Ok(())
    }

    fn stored(&self) -> usize {
        self.encoded.iter().map(Vec::len).sum()
    }
}
