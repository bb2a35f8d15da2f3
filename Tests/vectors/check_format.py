#!/usr/bin/env python3
"""Independent implementation of the coffer on-disk format, every version up to the newest,
and of the reverse views of §14.

This script is a cross-check of docs/FORMAT.md: it was written from the text of
that document alone (not from the Swift sources), re-implements every
construction the document specifies, and compares the results against the
known-answer vectors at the end of the document (the block between
`<!-- vectors:begin -->` and `<!-- vectors:end -->`). If the document and the
Swift code ever disagree, either this script or FormatVectorTests fails.

Besides the forward computations it checks the inverse direction: the passphrase
and recovery slots open to the master key, the short and long names decrypt to
their plaintexts, and tampered names are refused.

Dependencies: Python 3 standard library and libsodium (libsodium.so.23) through
ctypes.

Output: one line per check (`ok name` or `MISMATCH name: expected ... got ...`),
then `vectors: N passed, M failed` (N + M counts the vectors of the block plus the
round-trip checks). Exit status 0 if everything matched, 1 otherwise.
"""

import base64
import ctypes
import hashlib
import hmac
import os
import re
import struct
import sys

# ---------------------------------------------------------------------------
# libsodium through ctypes
# ---------------------------------------------------------------------------

sodium = ctypes.CDLL("libsodium.so.23")
if sodium.sodium_init() < 0:
    raise SystemExit("sodium_init failed")

_buf = ctypes.c_char_p
_size = ctypes.c_size_t
_u64 = ctypes.c_uint64
_u64p = ctypes.POINTER(ctypes.c_ulonglong)

sodium.crypto_kdf_derive_from_key.argtypes = [_buf, _size, _u64, _buf, _buf]
sodium.crypto_generichash.argtypes = [_buf, _size, _buf, ctypes.c_ulonglong, _buf, _size]
sodium.crypto_stream_xchacha20_xor.argtypes = [_buf, _buf, ctypes.c_ulonglong, _buf, _buf]
sodium.crypto_aead_xchacha20poly1305_ietf_encrypt.argtypes = [
    _buf, _u64p, _buf, ctypes.c_ulonglong, _buf, ctypes.c_ulonglong, _buf, _buf, _buf]
sodium.crypto_aead_xchacha20poly1305_ietf_decrypt.argtypes = [
    _buf, _u64p, _buf, _buf, ctypes.c_ulonglong, _buf, ctypes.c_ulonglong, _buf, _buf]
sodium.crypto_aead_aes256gcm_encrypt.argtypes = [
    _buf, _u64p, _buf, ctypes.c_ulonglong, _buf, ctypes.c_ulonglong, _buf, _buf, _buf]
sodium.crypto_pwhash.argtypes = [
    _buf, ctypes.c_ulonglong, _buf, ctypes.c_ulonglong, _buf,
    ctypes.c_ulonglong, _size, ctypes.c_int]

AEAD_TAG_BYTES = 16
AEAD_NONCE_BYTES = 24
ALG_ARGON2ID13 = 2


def kdf_derive(key32: bytes, subkey_id: int, context: bytes, length: int = 32) -> bytes:
    """crypto_kdf_derive_from_key(length, subkey_id, context, key)."""
    assert len(context) == 8 and len(key32) == 32
    out = ctypes.create_string_buffer(length)
    if sodium.crypto_kdf_derive_from_key(out, length, subkey_id, context, key32) != 0:
        raise RuntimeError("crypto_kdf_derive_from_key failed")
    return out.raw


def blake2b(n: int, message: bytes, key: bytes = b"") -> bytes:
    """BLAKE2b-n(key, m): crypto_generichash with an n-byte output (no key if empty)."""
    out = ctypes.create_string_buffer(n)
    if sodium.crypto_generichash(out, n, message, len(message), key or None, len(key)) != 0:
        raise RuntimeError("crypto_generichash failed")
    return out.raw


def xchacha20_xor(data: bytes, nonce: bytes, key: bytes) -> bytes:
    """crypto_stream_xchacha20_xor: data XOR the XChaCha20 key stream."""
    assert len(nonce) == 24 and len(key) == 32
    out = ctypes.create_string_buffer(max(len(data), 1))
    sodium.crypto_stream_xchacha20_xor(out, data, len(data), nonce, key)
    return out.raw[:len(data)]


def aead_seal(key: bytes, nonce: bytes, plaintext: bytes, ad: bytes) -> bytes:
    """crypto_aead_xchacha20poly1305_ietf_encrypt: returns ciphertext ‖ tag."""
    out = ctypes.create_string_buffer(len(plaintext) + AEAD_TAG_BYTES)
    out_len = ctypes.c_ulonglong(0)
    sodium.crypto_aead_xchacha20poly1305_ietf_encrypt(
        out, ctypes.byref(out_len), plaintext, len(plaintext), ad, len(ad), None, nonce, key)
    return out.raw[:out_len.value]


def aead_open(key: bytes, nonce: bytes, sealed: bytes, ad: bytes):
    """crypto_aead_xchacha20poly1305_ietf_decrypt: plaintext, or None if refused."""
    if len(sealed) < AEAD_TAG_BYTES:
        return None
    out = ctypes.create_string_buffer(max(len(sealed) - AEAD_TAG_BYTES, 1))
    out_len = ctypes.c_ulonglong(0)
    rc = sodium.crypto_aead_xchacha20poly1305_ietf_decrypt(
        out, ctypes.byref(out_len), None, sealed, len(sealed), ad, len(ad), nonce, key)
    return out.raw[:out_len.value] if rc == 0 else None


def x25519_public(secret: bytes) -> bytes:
    """crypto_scalarmult_base: the X25519 public key of a 32-byte secret."""
    out = ctypes.create_string_buffer(32)
    if sodium.crypto_scalarmult_base(out, secret) != 0:
        raise RuntimeError("crypto_scalarmult_base failed")
    return out.raw


def box_seal(plaintext: bytes, public: bytes) -> bytes:
    """crypto_box_seal: ephemeral public key ‖ XSalsa20-Poly1305 box (48 bytes longer)."""
    out = ctypes.create_string_buffer(len(plaintext) + 48)
    if sodium.crypto_box_seal(out, plaintext, len(plaintext), public) != 0:
        raise RuntimeError("crypto_box_seal failed")
    return out.raw


def box_seal_open(sealed: bytes, public: bytes, secret: bytes):
    """crypto_box_seal_open: the plaintext, or None if refused."""
    if len(sealed) < 48:
        return None
    out = ctypes.create_string_buffer(max(len(sealed) - 48, 1))
    rc = sodium.crypto_box_seal_open(out, sealed, len(sealed), public, secret)
    return out.raw[:len(sealed) - 48] if rc == 0 else None


def pwhash_argon2id(length: int, passphrase: bytes, salt: bytes, ops: int, mem: int) -> bytes:
    """crypto_pwhash(length, passphrase, salt, ops, mem, ALG_ARGON2ID13)."""
    assert len(salt) == 16
    out = ctypes.create_string_buffer(length)
    if sodium.crypto_pwhash(out, length, passphrase, len(passphrase), salt,
                            ops, mem, ALG_ARGON2ID13) != 0:
        raise RuntimeError("crypto_pwhash failed (out of memory?)")
    return out.raw


# ---------------------------------------------------------------------------
# Conventions
# ---------------------------------------------------------------------------

def b64url(data: bytes) -> str:
    """RFC 4648 §5 base64url without padding."""
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def b64url_decode(text: str) -> bytes:
    """Strict inverse of b64url: rejects padding, foreign characters and non-canonical
    spellings (unused low bits of the last character set). FORMAT.md does not say
    whether readers must be strict; this script is, so that a name has one spelling."""
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text) or len(text) % 4 == 1:
        raise ValueError("not base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if b64url(data) != text:
        raise ValueError("non-canonical base64url")
    return data


CONFLICT_MARKER = re.compile(
    rb"(?:\.sync-conflict-[0-9]{8}-[0-9]{6}-[A-Z0-9]{7}|"
    rb" \([^()]*conflicted copy[^()]*\)| \([0-9]{1,4}\))+")


def conflict_shown(k_mac: bytes, k_stream: bytes, iv: bytes, backing: str):
    """§5 The plaintext name of a sync engine's conflict copy of a short name: the
    marker run moves from the end of the encrypted name to before the extension."""
    raw = backing.encode("ascii")
    runs = list(CONFLICT_MARKER.finditer(raw))
    if len(runs) != 1 or runs[0].end() != len(raw):
        return None
    plain = decrypt_name(k_mac, k_stream, iv, raw[:runs[0].start()].decode("ascii"))
    if plain is None:
        return None
    dot = plain.rfind(b".")
    at = dot if dot > 0 else len(plain)
    return plain[:at] + runs[0].group(0) + plain[at:]


def u16(n: int) -> bytes:
    return struct.pack(">H", n)


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def u64(n: int) -> bytes:
    return struct.pack(">Q", n)


# ---------------------------------------------------------------------------
# §2 Key hierarchy
# ---------------------------------------------------------------------------

SUBKEY_CONTEXT = b"coffer01"
RECOVERY_CONTEXT = b"cofferrk"

SUBKEY_CONTENT = 1
SUBKEY_NAME_MAC = 2
SUBKEY_NAME_STREAM = 3
SUBKEY_METADATA = 4
SUBKEY_XATTR_NAME_MAC = 5
SUBKEY_XATTR_NAME_STREAM = 6
SUBKEY_PLACE = 7


def subkey(master: bytes, subkey_id: int) -> bytes:
    """§2 Subkeys: crypto_kdf_derive_from_key(32, id, "coffer01", master)."""
    return kdf_derive(master, subkey_id, SUBKEY_CONTEXT)


AFU_ROOT = 9
AFU_CONTEXT = b"cofferAF"


def afu_subkey(master: bytes, subkey_id: int) -> bytes:
    """§12 format 8: the AFU domain's subkey id = crypto_kdf(32, id, "cofferAF", K_afu),
    K_afu = subkey 9 of the master key."""
    return kdf_derive(subkey(master, AFU_ROOT), subkey_id, AFU_CONTEXT)


def file_key_wrap(k_metadata: bytes, file_id: bytes, file_key: bytes) -> bytes:
    """§12 format 8: key wrap = nonce ‖ AEAD(K_metadata, nonce, K_file, AD), AD = "coffer.file.key"
    ‖ 0x00 ‖ file ID, nonce = BLAKE2b-24(key = K_metadata, AD ‖ K_file) (Python's BLAKE2b)."""
    ad = b"coffer.file.key\0" + file_id
    nonce = hashlib.blake2b(ad + file_key, digest_size=24, key=k_metadata).digest()
    return nonce + aead_seal(k_metadata, nonce, file_key, ad)


REVERSE_KEY = 10


def reverse_mac(k_rev: bytes, n: int, message: bytes) -> bytes:
    """§14 H-n(m) = BLAKE2b-n(key = K_rev, m) (Python's BLAKE2b)."""
    return hashlib.blake2b(message, digest_size=n, key=k_rev).digest()


def reverse_root_iv(k_rev: bytes) -> bytes:
    """§14 root IV = H-16("coffer.rev.diriv" ‖ 0x00)."""
    return reverse_mac(k_rev, 16, b"coffer.rev.diriv\0")


def reverse_dir_iv(k_rev: bytes, parent_iv: bytes, name: bytes) -> bytes:
    """§14 directory IV = H-16("coffer.rev.diriv" ‖ 0x00 ‖ parent IV ‖ name)."""
    return reverse_mac(k_rev, 16, b"coffer.rev.diriv\0" + parent_iv + name)


def reverse_entry_id(k_rev: bytes, dir_iv: bytes, name: bytes) -> bytes:
    """§14 entry ID of an entry with one link = H-16("coffer.rev.file" ‖ 0x00 ‖ directory IV ‖ name)."""
    return reverse_mac(k_rev, 16, b"coffer.rev.file\0" + dir_iv + name)


def reverse_linked_id(k_rev: bytes, inode: int) -> bytes:
    """§14 entry ID of an inode with more links = H-16("coffer.rev.inode" ‖ 0x00 ‖ u64 inode)."""
    return reverse_mac(k_rev, 16, b"coffer.rev.inode\0" + u64(inode))


def reverse_block_nonce(k_rev: bytes, file_id: bytes, index: int, plaintext: bytes, gcm: bool = False) -> bytes:
    """§14 block i's nonce = H-24("coffer.rev.block" ‖ 0x00 ‖ file ID ‖ u64 i ‖ plaintext of block i);
    AES-256-GCM: its first 12 bytes ‖ 12 zero bytes."""
    nonce = reverse_mac(k_rev, 24, b"coffer.rev.block\0" + file_id + u64(index) + plaintext)
    return nonce[:12] + bytes(12) if gcm else nonce


def reverse_symlink_nonce(k_rev: bytes, entry_id: bytes, target: bytes) -> bytes:
    """§14 symlink nonce = H-24("coffer.rev.link" ‖ 0x00 ‖ entry ID ‖ target)."""
    return reverse_mac(k_rev, 24, b"coffer.rev.link\0" + entry_id + target)


def kek_pass(passphrase: bytes, salt: bytes, ops: int, mem: int) -> bytes:
    """§2 KEK_pass = crypto_pwhash(32, passphrase, salt, ops, mem, ALG_ARGON2ID13)."""
    return pwhash_argon2id(32, passphrase, salt, ops, mem)


def kek_rec(recovery_key: bytes) -> bytes:
    """§2 KEK_rec = crypto_kdf_derive_from_key(32, 1, "cofferrk", recovery key)."""
    return kdf_derive(recovery_key, 1, RECOVERY_CONTEXT)


def format_recovery_key(recovery_key: bytes) -> str:
    """§2: 64 lowercase hex digits in 16 groups of 4 joined by '-'."""
    digits = recovery_key.hex()
    return "-".join(digits[i:i + 4] for i in range(0, 64, 4))


def parse_recovery_key(text: str) -> bytes:
    """§2: parsers ignore '-', spaces and line breaks and accept either case."""
    digits = re.sub(r"[-\s]", "", text).lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digits):
        raise ValueError("not a recovery key")
    return bytes.fromhex(digits)


# ---------------------------------------------------------------------------
# §3 coffer.conf
# ---------------------------------------------------------------------------

def str_field(s: str) -> bytes:
    """§3 `str s` = u16 len(s) ‖ UTF-8 bytes of s."""
    data = s.encode("utf-8")
    return u16(len(data)) + data


def canonical_parameters(fmt: int, created: str, content_cipher: str, block_size: int,
                         kdf_algorithm: str, ops: int, mem: int, salt: bytes) -> bytes:
    """§3 Canonical parameters (the salt enters as its base64url text)."""
    return (b"coffer.conf" + b"\x00" + u32(fmt) + str_field(created)
            + str_field(content_cipher) + u32(block_size) + str_field(kdf_algorithm)
            + u64(ops) + u64(mem) + str_field(b64url(salt)))


def config_checksum(canonical: bytes) -> str:
    """§3 checksum = base64url(BLAKE2b-32(no key, canonical parameters))."""
    return b64url(blake2b(32, canonical))


def slot_ad(canonical: bytes, kind: str) -> bytes:
    """§3 Key slot AD = canonical parameters ‖ str kind."""
    return canonical + str_field(kind)


def wrap_key_slot(kek: bytes, nonce: bytes, master: bytes, canonical: bytes, kind: str) -> str:
    """§3 Key slot: base64url(nonce(24) ‖ AEAD_seal(KEK, nonce, master key, AD))."""
    return b64url(nonce + aead_seal(kek, nonce, master, slot_ad(canonical, kind)))


SLOT_FILE_VERSION = 1


def slot_file_ad(canonical: bytes, slot_id: str, kind: str, label: str, algorithm: str,
                 ops: int, mem: int, salt_text: str) -> bytes:
    """§13 AD = "coffer.slot" ‖ 0x00 ‖ u32 slot ‖ canonical parameters ‖ str id ‖ str kind
    ‖ str label ‖ str kdf.algorithm ‖ u64 opsLimit ‖ u64 memLimit ‖ str kdf.salt."""
    return (b"coffer.slot\x00" + u32(SLOT_FILE_VERSION) + canonical + str_field(slot_id)
            + str_field(kind) + str_field(label) + str_field(algorithm) + u64(ops) + u64(mem)
            + str_field(salt_text))


def keyed_slot_file_ad(canonical: bytes, slot_id: str, kind: str, label: str, tpm2=None) -> bytes:
    """§13 AD of a keyed slot (tpm2, keyring): as a passphrase slot's, without a KDF
    (str "" ‖ u64 0 ‖ u64 0 ‖ str ""); a tpm2 slot appends str public ‖ str private
    ‖ str pcrs (decimal, comma-separated) ‖ str pcrBank ‖ str machine."""
    ad = slot_file_ad(canonical, slot_id, kind, label, "", 0, 0, "")
    if kind == "tpm2":
        ad += (str_field(tpm2["public"]) + str_field(tpm2["private"])
               + str_field(",".join(str(p) for p in tpm2["pcrs"])) + str_field(tpm2["pcrBank"])
               + str_field(tpm2["machine"]))
    return ad


def slot_file_open(kek: bytes, wrapped: str, ad: bytes):
    """§13 wrappedKey = base64url(nonce(24) ‖ AEAD_seal(KEK, nonce, master key, AD)); None if it does not open."""
    raw = b64url_decode(wrapped)
    return aead_open(kek, raw[:24], raw[24:], ad)


def unwrap_key_slot(kek: bytes, wrapped: str, canonical: bytes, kind: str):
    """Inverse of wrap_key_slot: the master key, or None if the slot does not open."""
    raw = b64url_decode(wrapped)
    if len(raw) != 72:
        return None
    return aead_open(kek, raw[:AEAD_NONCE_BYTES], raw[AEAD_NONCE_BYTES:],
                     slot_ad(canonical, kind))


# ---------------------------------------------------------------------------
# §4 File contents
# ---------------------------------------------------------------------------

HEADER_VERSION = 1
BLOCK_SIZE = 4096


def aes_file_key(k_content: bytes, file_id: bytes) -> bytes:
    """§4 K_file = BLAKE2b-32(key = K_content, empty, salt = file ID, personal = "coffer-aes-file1").

    Python's own hashlib BLAKE2b, not libsodium: a second implementation of the hash."""
    return hashlib.blake2b(b"", digest_size=32, key=k_content, salt=file_id,
                           person=b"coffer-aes-file1").digest()


def aes_gcm_seal(key: bytes, nonce12: bytes, plaintext: bytes, ad: bytes) -> bytes:
    """crypto_aead_aes256gcm_encrypt: returns ciphertext ‖ tag."""
    assert len(nonce12) == 12 and len(key) == 32
    if sodium.crypto_aead_aes256gcm_is_available() != 1:
        raise SystemExit("this CPU has no AES-NI: the AES-256-GCM vectors cannot be checked here")
    out = ctypes.create_string_buffer(len(plaintext) + AEAD_TAG_BYTES)
    out_len = ctypes.c_ulonglong(0)
    sodium.crypto_aead_aes256gcm_encrypt(
        out, ctypes.byref(out_len), plaintext, len(plaintext), ad, len(ad), None, nonce12, key)
    return out.raw[:out_len.value]


def content_block_aes(k_content: bytes, file_id: bytes, index: int, nonce: bytes,
                      plaintext: bytes) -> bytes:
    """§4 aes256gcm: nonce field = 12 random bytes ‖ 12 zeros; GCM under K_file with the first 12."""
    assert len(nonce) == 24 and nonce[12:] == bytes(12) and 1 <= len(plaintext) <= BLOCK_SIZE
    return nonce + aes_gcm_seal(aes_file_key(k_content, file_id), nonce[:12], plaintext,
                                file_id + u64(index))


def content_header(file_id: bytes) -> bytes:
    """§4 header = u16 version (0x0001) ‖ file ID (16 bytes)."""
    assert len(file_id) == 16
    return u16(HEADER_VERSION) + file_id


def content_header_v2(file_id: bytes, tag: bytes) -> bytes:
    """§4 format 4: header = u16 version (0x0002) ‖ file ID (16 bytes) ‖ place tag (16 bytes)."""
    assert len(file_id) == 16 and len(tag) == 16
    return u16(2) + file_id + tag


def place_tag(k_place: bytes, file_id: bytes, dir_iv: bytes, name: bytes) -> bytes:
    """§4 place tag = BLAKE2b-16(key = K_place, "coffer.place" ‖ 0x00 ‖ file ID ‖ dirIV ‖ name).

    Python's own hashlib BLAKE2b, not libsodium: a second implementation of the hash."""
    return hashlib.blake2b(b"coffer.place\0" + file_id + dir_iv + name, digest_size=16, key=k_place).digest()


def linked_tag(k_place: bytes, file_id: bytes) -> bytes:
    """§4 tag of a file with hard links = BLAKE2b-16(key = K_place, "coffer.linked" ‖ 0x00 ‖ file ID)."""
    return hashlib.blake2b(b"coffer.linked\0" + file_id, digest_size=16, key=k_place).digest()


def directory_tag(k_place: bytes, iv: bytes, parent_iv: bytes, name: bytes) -> bytes:
    """§5 format 5: tag of a directory IV = BLAKE2b-16(key = K_place, "coffer.dirplace" ‖ 0x00 ‖ IV ‖
    parent's IV ‖ name); parent's IV and name are empty for the vault's root."""
    assert len(iv) == 16 and (len(parent_iv) == 16 and name or not parent_iv and not name)
    return hashlib.blake2b(b"coffer.dirplace\0" + iv + parent_iv + name, digest_size=16, key=k_place).digest()


def directory_iv_file(iv: bytes, tag: bytes, previous: bytes = bytes(16)) -> bytes:
    """§5 format 5: coffer.diriv = IV ‖ tag of its place ‖ tag of its place before its last rename."""
    return iv + tag + previous


def final_block(k_content: bytes, file_id: bytes, index: int, nonce: bytes, plaintext: bytes) -> bytes:
    """§4 format 4: the final block holds 0…4095 bytes, sealed as any block."""
    assert 0 <= len(plaintext) < BLOCK_SIZE
    return nonce + aead_seal(k_content, nonce, plaintext, file_id + u64(index))


def content_block(k_content: bytes, file_id: bytes, index: int, nonce: bytes,
                  plaintext: bytes) -> bytes:
    """§4 block i = nonce ‖ AEAD_seal(K_content, nonce, plaintext, AD = file ID ‖ u64 i)."""
    assert 1 <= len(plaintext) <= BLOCK_SIZE
    return nonce + aead_seal(k_content, nonce, plaintext, file_id + u64(index))


def xchacha_file_key(k_content: bytes, file_id: bytes) -> bytes:
    """§4 format 6: K_file = BLAKE2b-32(key = K_content, empty, salt = file ID, personal = "coffer-xch-file1")."""
    return hashlib.blake2b(b"", digest_size=32, key=k_content, salt=file_id,
                           person=b"coffer-xch-file1").digest()


def class_record(k_metadata: bytes, dir_iv: bytes, protection_class: int, converting_from: int = None) -> bytes:
    """§12 format 6: coffer.class = nonce(24) ‖ AEAD_seal(K_metadata, nonce, 01 ‖ class, AD = "coffer.class" ‖ 00 ‖ IV),
    nonce = BLAKE2b-24(key = K_metadata, AD ‖ plaintext); format 8's converting record seals 02 ‖ from ‖ to."""
    ad = b"coffer.class\x00" + dir_iv
    plain = bytes([1, protection_class]) if converting_from is None else bytes([2, converting_from, protection_class])
    nonce = hashlib.blake2b(ad + plain, digest_size=24, key=k_metadata).digest()
    return nonce + aead_seal(k_metadata, nonce, plain, ad)


# ---------------------------------------------------------------------------
# §5 Names
# ---------------------------------------------------------------------------

def pkcs7_pad(p: bytes) -> bytes:
    """§5 padded = p ‖ k bytes of value k, k = 16 − (len(p) mod 16)."""
    k = 16 - (len(p) % 16)
    return p + bytes([k]) * k


def pkcs7_unpad(padded: bytes):
    if not padded or len(padded) % 16:
        return None
    k = padded[-1]
    if not 1 <= k <= 16 or padded[-k:] != bytes([k]) * k:
        return None
    return padded[:-k]


def encrypt_name(k_mac: bytes, k_stream: bytes, iv: bytes, plain: bytes) -> str:
    """§5 stored = base64url(siv ‖ body)."""
    padded = pkcs7_pad(plain)
    siv = blake2b(16, iv + padded, key=k_mac)
    body = xchacha20_xor(padded, siv + bytes(8), k_stream)
    return b64url(siv + body)


def decrypt_name(k_mac: bytes, k_stream: bytes, iv: bytes, stored: str):
    """§5 decryption: recompute the SIV, compare in constant time, check padding."""
    try:
        raw = b64url_decode(stored)
    except ValueError:
        return None
    if len(raw) < 32 or len(raw) % 16:
        return None
    siv, body = raw[:16], raw[16:]
    padded = xchacha20_xor(body, siv + bytes(8), k_stream)
    if not hmac.compare_digest(siv, blake2b(16, iv + padded, key=k_mac)):
        return None
    return pkcs7_unpad(padded)


# ---------------------------------------------------------------------------
# §6 Long names
# ---------------------------------------------------------------------------

LONG_PREFIX = "coffer.long."


def long_name(stored: str) -> str:
    """§6 coffer.long.<base64url(BLAKE2b-32(no key, stored))>."""
    return LONG_PREFIX + b64url(blake2b(32, stored.encode("ascii")))


def backing_name(k_mac: bytes, k_stream: bytes, iv: bytes, plain: bytes):
    """§5/§6: (entry name, sidecar content or None)."""
    stored = encrypt_name(k_mac, k_stream, iv, plain)
    if len(stored) > 255:
        return long_name(stored), stored
    return stored, None


# ---------------------------------------------------------------------------
# §7 Symlinks
# ---------------------------------------------------------------------------

SYMLINK_AD = b"coffer.symlink"
SYMLINK_INLINE_MAX = 3031
TARGET_PREFIX = "coffer.target."


def symlink_stored(k_metadata: bytes, nonce: bytes, target: bytes) -> str:
    """§7 stored = base64url(nonce ‖ AEAD_seal(K_metadata, nonce, target, AD = "coffer.symlink"))."""
    return b64url(nonce + aead_seal(k_metadata, nonce, target, SYMLINK_AD))


def symlink_backing(k_metadata: bytes, nonce: bytes, target: bytes):
    """§7: (backing symlink target, sidecar content or None)."""
    stored = symlink_stored(k_metadata, nonce, target)
    if len(target) <= SYMLINK_INLINE_MAX:
        return stored, None
    return TARGET_PREFIX + b64url(blake2b(32, stored.encode("ascii"))), stored


def symlink_open(k_metadata: bytes, stored: str):
    raw = b64url_decode(stored)
    return aead_open(k_metadata, raw[:AEAD_NONCE_BYTES], raw[AEAD_NONCE_BYTES:], SYMLINK_AD)


# ---------------------------------------------------------------------------
# §10 Test vectors
# ---------------------------------------------------------------------------

def seq(first: int, last: int) -> bytes:
    """The byte run `first first+1 … last` used by §10."""
    return bytes(range(first, last + 1))


# Inputs, as stated in the prose of §10.
MASTER_KEY = seq(0x00, 0x1F)
FILE_ID = seq(0xA0, 0xAF)
BLOCK_INDEX = 3
BLOCK_NONCE = seq(0x40, 0x57)
BLOCK_PLAINTEXT = seq(0x00, 0x63)
DIR_IV = seq(0xF0, 0xFF)
CREATED = "2026-01-01T00:00:00Z"
SALT = seq(0x10, 0x1F)
OPS_LIMIT = 2
MEM_LIMIT = 67108864
PASS_SLOT_NONCE = seq(0x60, 0x77)
RECOVERY_KEY = seq(0x80, 0x9F)
RECOVERY_SLOT_NONCE = seq(0x90, 0xA7)
SYMLINK_NONCE = seq(0xC0, 0xD7)

# Fixed values of format 2 (§3); the config vector is a format-2 config.
FORMAT = 2
CONTENT_CIPHER = "xchacha20-poly1305"
KDF_ALGORITHM = "argon2id13"


def read_vectors(path: str) -> dict:
    """Parse `name = value` lines between the vector markers; indented lines continue
    the previous value and are appended with their surrounding white space removed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    block = text.split("<!-- vectors:begin -->", 1)[1].split("<!-- vectors:end -->", 1)[0]
    vectors, last = {}, None
    for line in block.splitlines():
        if not line.strip() or line.strip().startswith("```"):
            continue
        if line[0].isspace():
            if last is None:
                raise ValueError("continuation line before any vector: %r" % line)
            vectors[last] += line.strip()
            continue
        name, sep, value = line.partition(" = ")
        if not sep:
            raise ValueError("unparseable vector line: %r" % line)
        last = name.strip()
        vectors[last] = value.strip()
    return vectors


def parse_repeat(description: str) -> bytes:
    """`200 × 'L' (0x4c)` → 200 bytes of 0x4c."""
    m = re.fullmatch(r"(\d+)\s*×\s*'(.)'(?:\s*\(0x([0-9a-fA-F]{2})\))?", description)
    if not m:
        raise ValueError("unrecognised repeated-byte description: %r" % description)
    byte = m.group(2).encode("ascii")
    if m.group(3) and byte != bytes.fromhex(m.group(3)):
        raise ValueError("character and hex code disagree in %r" % description)
    return byte * int(m.group(1))


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    vectors = read_vectors(os.path.join(here, "..", "..", "docs", "FORMAT.md"))
    results = []  # (name, expected, got)

    def check(name, got, expected=None):
        if expected is None:
            expected = vectors.get(name, "<missing from FORMAT.md>")
        results.append((name, expected, got))

    # §2 master key and subkeys
    check("master_key", MASTER_KEY.hex())
    keys = {i: subkey(MASTER_KEY, i) for i in range(1, 11)}
    for i in range(1, 11):
        check("subkey_%d" % i, keys[i].hex())
    afu = {i: afu_subkey(MASTER_KEY, i) for i in range(1, 8)}
    for i in range(1, 8):
        check("afu_subkey_%d" % i, afu[i].hex())

    # §4 content
    check("content_file_header", content_header(FILE_ID).hex())
    check("content_block_3", content_block(keys[SUBKEY_CONTENT], FILE_ID, BLOCK_INDEX,
                                           BLOCK_NONCE, BLOCK_PLAINTEXT).hex())
    tag = place_tag(keys[SUBKEY_PLACE], FILE_ID, DIR_IV, b"hello.txt")
    check("place_tag", tag.hex())
    check("place_tag_linked", linked_tag(keys[SUBKEY_PLACE], FILE_ID).hex())
    check("content_file_header_v2", content_header_v2(FILE_ID, tag).hex())
    # §12 format 8: a file's own key (30 … 4f) wrapped in each domain; its version-4 header
    # in the AFU domain, whose place key tags it.
    check("file_key_wrap", file_key_wrap(keys[SUBKEY_METADATA], FILE_ID, seq(0x30, 0x4F)).hex())
    afu_wrap = file_key_wrap(afu[SUBKEY_METADATA], FILE_ID, seq(0x30, 0x4F))
    check("file_key_wrap_afu", afu_wrap.hex())
    afu_tag = place_tag(afu[SUBKEY_PLACE], FILE_ID, DIR_IV, b"hello.txt")
    check("content_file_header_v4_afu", (u16(4) + FILE_ID + afu_tag + afu_wrap).hex())
    check("roundtrip:file_key_wrap_is_72_bytes", str(len(afu_wrap)), "72")
    # §12 format 8: the converting record of directory IV f0 … ff, complete to after-first-unlock
    check("class_record_converting_afu", class_record(afu[SUBKEY_METADATA], DIR_IV, 2, converting_from=0).hex())
    # §5 format 5: a directory's IV file bound to its place
    dir_tag = directory_tag(keys[SUBKEY_PLACE], DIR_IV, seq(0xE0, 0xEF), b"docs")
    check("dir_tag", dir_tag.hex())
    check("dir_tag_root", directory_tag(keys[SUBKEY_PLACE], DIR_IV, b"", b"").hex())
    check("diriv_file_v5", directory_iv_file(DIR_IV, dir_tag).hex())
    check("content_final_block_1_empty", final_block(keys[SUBKEY_CONTENT], FILE_ID, 1, BLOCK_NONCE, b"").hex())
    check("content_block_3_aes256gcm",
          content_block_aes(keys[SUBKEY_CONTENT], FILE_ID, BLOCK_INDEX,
                            BLOCK_NONCE[:12] + bytes(12), BLOCK_PLAINTEXT).hex())
    # §4 format 6: XChaCha20-Poly1305 blocks under the file's own key
    file_key = xchacha_file_key(keys[SUBKEY_CONTENT], FILE_ID)
    check("file_key_xchacha_v6", file_key.hex())
    check("content_block_3_v6", content_block(file_key, FILE_ID, BLOCK_INDEX, BLOCK_NONCE, BLOCK_PLAINTEXT).hex())
    # §12 format 6: the class record of directory IV f0 … ff, unless-open
    record = class_record(keys[SUBKEY_METADATA], DIR_IV, 1)
    check("class_record_unless_open", record.hex())
    opened = aead_open(keys[SUBKEY_METADATA], record[:24], record[24:], b"coffer.class\x00" + seq(0xE0, 0xEF))
    check("roundtrip:class_record_refused_in_another_directory", repr(opened), repr(None))
    # §12 format 6: drops. The key pair; a dropped name and a key record made once (sealing
    # is random), which must open; and this implementation's own seals, which must too.
    drop_secret, drop_public = keys[8], x25519_public(keys[8])
    check("drop_public_key", drop_public.hex())
    def open_drop_name(backing):
        raw = box_seal_open(b64url_decode(backing[len("coffer.drop."):]), drop_public, drop_secret)
        return raw and pkcs7_unpad(raw)
    check("drop_name_backing", repr(open_drop_name(vectors["drop_name_backing"])), repr(b"hello.txt"))
    def open_record(hex_record):
        raw = box_seal_open(bytes.fromhex(hex_record), drop_public, drop_secret)
        return raw and (raw[0], raw[1:17], raw[17:])
    check("drop_key_record", repr(open_record(vectors["drop_key_record"])), repr((1, FILE_ID, seq(0x30, 0x4F))))
    # Conversion: a dropped directory's IV, and the name a drop takes when its own is taken.
    dropped = vectors["drop_name_backing"].encode()
    check("drop_directory_iv", hashlib.blake2b(b"coffer.dropdir\x00" + dropped, digest_size=32).digest()[:16].hex())
    taken_mark = hashlib.blake2b(dropped, digest_size=32).digest()[:4].hex()
    check("drop_taken_name", "hello.txt (dropped %s)" % taken_mark)
    long_suffix = " (dropped %s)" % taken_mark
    check("roundtrip:drop_taken_name_fits", str(len(b"L" * (255 - len(long_suffix)) + long_suffix.encode())), "255")
    own_name = "coffer.drop." + b64url(box_seal(pkcs7_pad(b"hello.txt"), drop_public))
    check("roundtrip:drop_name_opens", repr(open_drop_name(own_name)), repr(b"hello.txt"))
    check("roundtrip:drop_name_length", str(len(own_name)), str(len("coffer.drop.") + (48 + 16) * 4 // 3 + 1))
    # §12 format 7: the binding of the content vector's file in directory f0 … ff, the name
    # sealed with it (binding ‖ name ‖ padding), and the record marked placed.
    binding = hashlib.blake2b(b"coffer.drop\x00" + DIR_IV + FILE_ID, digest_size=32).digest()[:16]
    check("drop_binding", binding.hex())
    def open_bound_name(backing):
        raw = box_seal_open(b64url_decode(backing[len("coffer.drop."):]), drop_public, drop_secret)
        return raw and (raw[:16], pkcs7_unpad(raw[16:]))
    check("drop_name_backing_bound", repr(open_bound_name(vectors["drop_name_backing_bound"])), repr((binding, b"hello.txt")))
    placed_ad = b"coffer.drop.placed\x00" + FILE_ID
    placed_plain = bytes([2]) + FILE_ID + seq(0x30, 0x4F)
    placed_nonce = hashlib.blake2b(placed_ad + placed_plain, digest_size=24, key=keys[SUBKEY_METADATA]).digest()
    check("drop_key_record_placed", (placed_nonce + aead_seal(keys[SUBKEY_METADATA], placed_nonce, placed_plain, placed_ad)).hex())
    longest = b"n" * 111
    bound_name = "coffer.drop." + b64url(box_seal(binding + pkcs7_pad(longest), drop_public))
    check("roundtrip:drop_name_bound_opens", repr(open_bound_name(bound_name)), repr((binding, longest)))
    check("roundtrip:drop_name_bound_longest_fits", str(len(bound_name) <= 255), "True")

    # §5 short name
    k_mac, k_stream = keys[SUBKEY_NAME_MAC], keys[SUBKEY_NAME_STREAM]
    short_plain = vectors["name_short_plain"].encode("utf-8")
    short_name, short_sidecar = backing_name(k_mac, k_stream, DIR_IV, short_plain)
    check("name_short_backing", short_name)
    check("name_short_plain",
          repr(decrypt_name(k_mac, k_stream, DIR_IV, vectors["name_short_backing"])),
          repr(short_plain))
    check("roundtrip:name_short_is_short", repr(short_sidecar), repr(None))

    # tampered copies of the documented short name: one flipped byte in the SIV, in the
    # body, and in the padding byte; each must be refused
    raw = b64url_decode(vectors["name_short_backing"])
    for label, pos in (("siv", 0), ("body", 16), ("padding", len(raw) - 1)):
        tampered = bytearray(raw)
        tampered[pos] ^= 0x01
        got = decrypt_name(k_mac, k_stream, DIR_IV, b64url(bytes(tampered)))
        check("roundtrip:name_short_tampered_%s_refused" % label, repr(got), repr(None))

    # the same name with the unused low bits of its last base64url character set:
    # a lenient decoder would accept it as a second spelling of "hello.txt"
    name = vectors["name_short_backing"]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    respelled = name[:-1] + alphabet[alphabet.index(name[-1]) ^ 0x01]
    check("roundtrip:name_short_noncanonical_base64_refused",
          repr(decrypt_name(k_mac, k_stream, DIR_IV, respelled)), repr(None))

    # §5 strict names and conflict copies: a valid name with a suffix is no name; a
    # Syncthing conflict copy is shown with its marker before the extension
    check("name_suffixed_backing", short_name + ".bak")
    check("name_conflict_backing", short_name + ".sync-conflict-20261123-101500-ABCDEFG")
    check("roundtrip:name_suffixed_refused",
          repr(decrypt_name(k_mac, k_stream, DIR_IV, vectors["name_suffixed_backing"])), repr(None))
    check("name_conflict_shown",
          repr(conflict_shown(k_mac, k_stream, DIR_IV, vectors["name_conflict_backing"])),
          repr(vectors["name_conflict_shown"].encode("utf-8")))

    # §6 long name
    long_plain = parse_repeat(vectors["name_long_plain"])
    long_entry, long_sidecar = backing_name(k_mac, k_stream, DIR_IV, long_plain)
    check("name_long_backing", long_entry)
    check("name_long_sidecar", long_sidecar)
    sidecar_doc = vectors["name_long_sidecar"]
    check("name_long_plain",
          repr(decrypt_name(k_mac, k_stream, DIR_IV, sidecar_doc)), repr(long_plain))
    check("roundtrip:long_name_length_55", str(len(long_entry)), "55")
    check("roundtrip:sidecar_hash_matches_entry", long_name(sidecar_doc),
          vectors["name_long_backing"])

    # §7 symlinks: one target in the link, one in a sidecar
    k_meta = keys[SUBKEY_METADATA]
    short_target = vectors["symlink_short_plain"].encode("utf-8")
    link, sidecar = symlink_backing(k_meta, SYMLINK_NONCE, short_target)
    check("symlink_short_backing", link)
    check("symlink_short_plain", repr(symlink_open(k_meta, vectors["symlink_short_backing"])), repr(short_target))
    check("roundtrip:symlink_short_is_inline", repr(sidecar), repr(None))
    long_target = parse_repeat(vectors["symlink_long_plain"])
    link, sidecar = symlink_backing(k_meta, SYMLINK_NONCE, long_target)
    check("symlink_long_backing", link)
    check("symlink_long_plain", repr(symlink_open(k_meta, sidecar) == long_target), repr(True))
    check("roundtrip:symlink_reference_length_57", str(len(vectors["symlink_long_backing"])), "57")

    # §3 config
    check("config_format", str(FORMAT))
    canonical = canonical_parameters(FORMAT, CREATED, CONTENT_CIPHER, BLOCK_SIZE,
                                     KDF_ALGORITHM, OPS_LIMIT, MEM_LIMIT, SALT)
    check("config_canonical_parameters", canonical.hex())
    check("config_checksum", config_checksum(canonical))

    # §2/§3 passphrase slot
    passphrase = vectors["slot_passphrase"].encode("utf-8")
    kek_p = kek_pass(passphrase, SALT, OPS_LIMIT, MEM_LIMIT)
    check("slot_passphrase_kek", kek_p.hex())
    check("slot_passphrase_wrapped",
          wrap_key_slot(kek_p, PASS_SLOT_NONCE, MASTER_KEY, canonical, "passphrase"))
    opened = unwrap_key_slot(kek_p, vectors["slot_passphrase_wrapped"], canonical, "passphrase")
    check("slot_passphrase", repr(opened and opened.hex()), repr(MASTER_KEY.hex()))
    wrong_kind = unwrap_key_slot(kek_p, vectors["slot_passphrase_wrapped"], canonical,
                                 "recovery")
    check("roundtrip:passphrase_slot_refused_as_recovery", repr(wrong_kind), repr(None))

    # §2/§3 recovery key and slot
    check("slot_recovery_key", format_recovery_key(RECOVERY_KEY))
    sloppy = vectors["slot_recovery_key"].upper().replace("-", " ", 3) + "\n"
    check("roundtrip:recovery_key_parses", parse_recovery_key(sloppy).hex(), RECOVERY_KEY.hex())
    kek_r = kek_rec(RECOVERY_KEY)
    check("slot_recovery_wrapped",
          wrap_key_slot(kek_r, RECOVERY_SLOT_NONCE, MASTER_KEY, canonical, "recovery"))
    opened = unwrap_key_slot(kek_r, vectors["slot_recovery_wrapped"], canonical, "recovery")
    check("roundtrip:recovery_slot_opens", repr(opened and opened.hex()), repr(MASTER_KEY.hex()))

    # §13 a slot file of that config: its own salt, id, label, nonce
    slot_salt = seq(0xb0, 0xbf)
    slot_id = "00112233445566778899aabbccddeeff"
    ad = slot_file_ad(canonical, slot_id, "passphrase", "laptop", KDF_ALGORITHM, OPS_LIMIT, MEM_LIMIT,
                      b64url(slot_salt))
    check("slot_file_ad", ad.hex())
    slot_words = vectors["slot_file_passphrase"].encode("utf-8")
    kek_s = kek_pass(slot_words, slot_salt, OPS_LIMIT, MEM_LIMIT)
    check("slot_file_kek", kek_s.hex())
    nonce = seq(0x20, 0x37)
    check("slot_file_wrapped", b64url(nonce + aead_seal(kek_s, nonce, MASTER_KEY, ad)))
    opened = slot_file_open(kek_s, vectors["slot_file_wrapped"], ad)
    check("slot_file_passphrase", repr(opened and opened.hex()), repr(MASTER_KEY.hex()))
    relabelled = slot_file_ad(canonical, slot_id, "passphrase", "desktop", KDF_ALGORITHM, OPS_LIMIT,
                              MEM_LIMIT, b64url(slot_salt))
    check("roundtrip:slot_file_refused_with_another_label",
          repr(slot_file_open(kek_s, vectors["slot_file_wrapped"], relabelled)), repr(None))

    # §13 keyed slot files of that config: the slot key (which a TPM or a keyring keeps)
    # is the AEAD key itself
    tpm2 = {"public": b64url(seq(0x01, 0x10)), "private": b64url(seq(0x21, 0x30)), "pcrs": [0, 7],
            "pcrBank": "sha256", "machine": "000b" + seq(0x40, 0x5f).hex()}
    keyed = [("tpm2", "ffeeddccbbaa99887766554433221100", "laptop TPM", seq(0xc0, 0xdf), seq(0x38, 0x4f), tpm2),
             ("keyring", "0123456789abcdef0123456789abcdef", "keyring", seq(0xe0, 0xff), seq(0x50, 0x67), None)]
    for kind, keyed_id, label, slot_key, nonce, binding in keyed:
        check(f"slot_{kind}_key", slot_key.hex())
        ad = keyed_slot_file_ad(canonical, keyed_id, kind, label, binding)
        check(f"slot_{kind}_ad", ad.hex())
        check(f"slot_{kind}_wrapped", b64url(nonce + aead_seal(slot_key, nonce, MASTER_KEY, ad)))
        opened = slot_file_open(slot_key, vectors[f"slot_{kind}_wrapped"], ad)
        check(f"roundtrip:slot_{kind}_opens", repr(opened and opened.hex()), repr(MASTER_KEY.hex()))
    moved = keyed_slot_file_ad(canonical, keyed[0][1], "tpm2", "laptop TPM", dict(tpm2, pcrs=[7]))
    check("roundtrip:slot_tpm2_refused_with_other_pcrs",
          repr(slot_file_open(keyed[0][3], vectors["slot_tpm2_wrapped"], moved)), repr(None))

    # §11 undo-journal record of content block 3: header, old slot, zeros to 4208 bytes
    old_slot = content_block(keys[SUBKEY_CONTENT], FILE_ID, BLOCK_INDEX, BLOCK_NONCE, BLOCK_PLAINTEXT)
    header = (b"cofferU1" + FILE_ID + u64(BLOCK_INDEX) + u64(1) + u32(len(BLOCK_PLAINTEXT)) + u32(0)
              + seq(0x70, 0x87))
    check("journal_record_header", header.hex())
    record = header + old_slot + bytes(4208 - len(header) - len(old_slot))
    opened = aead_open(keys[SUBKEY_CONTENT], record[72:96], record[96:72 + len(old_slot)],
                       FILE_ID + u64(BLOCK_INDEX))
    check("roundtrip:journal_record_slot_opens", repr(opened), repr(BLOCK_PLAINTEXT))

    # §14 reverse views: docs/ at the root, docs/hello.txt (00 … 63, one link), docs/link
    # (to hello.txt, one link), and inode 1234567 of more links
    k_rev = keys[REVERSE_KEY]
    root_iv = reverse_root_iv(k_rev)
    docs_iv = reverse_dir_iv(k_rev, root_iv, b"docs")
    check("reverse_root_iv", root_iv.hex())
    check("reverse_dir_iv", docs_iv.hex())
    check("reverse_diriv_file", directory_iv_file(docs_iv, directory_tag(keys[SUBKEY_PLACE], docs_iv, root_iv, b"docs")).hex())
    rev_id = reverse_entry_id(k_rev, docs_iv, b"hello.txt")
    check("reverse_file_id", rev_id.hex())
    check("reverse_file_header", content_header_v2(rev_id, place_tag(keys[SUBKEY_PLACE], rev_id, docs_iv, b"hello.txt")).hex())
    rev_plain = seq(0x00, 0x63)
    rev_nonce = reverse_block_nonce(k_rev, rev_id, 0, rev_plain)
    rev_block = final_block(xchacha_file_key(keys[SUBKEY_CONTENT], rev_id), rev_id, 0, rev_nonce, rev_plain)
    check("reverse_final_block_0", rev_block.hex())
    check("roundtrip:reverse_final_block_0_opens",
          repr(aead_open(xchacha_file_key(keys[SUBKEY_CONTENT], rev_id), rev_block[:24], rev_block[24:], rev_id + u64(0))),
          repr(rev_plain))
    gcm_nonce = reverse_block_nonce(k_rev, rev_id, 0, rev_plain, gcm=True)
    check("reverse_final_block_0_aes256gcm",
          (gcm_nonce + aes_gcm_seal(aes_file_key(keys[SUBKEY_CONTENT], rev_id), gcm_nonce[:12], rev_plain,
                                    rev_id + u64(0))).hex())
    check("reverse_linked_file_id", reverse_linked_id(k_rev, 1234567).hex())
    link_id = reverse_entry_id(k_rev, docs_iv, b"link")
    stored = symlink_stored(keys[SUBKEY_METADATA], reverse_symlink_nonce(k_rev, link_id, b"hello.txt"), b"hello.txt")
    check("reverse_symlink_stored", stored)
    check("roundtrip:reverse_symlink_opens", repr(symlink_open(keys[SUBKEY_METADATA], stored)), repr(b"hello.txt"))

    # every vector of the document must have been checked
    checked = {name for name, _, _ in results}
    for name in sorted(set(vectors) - checked):
        results.append((name, vectors[name], "<not checked by this script>"))

    passed = failed = 0
    for name, expected, got in results:
        if expected == got:
            passed += 1
            print("ok", name)
        else:
            failed += 1
            print("MISMATCH %s: expected %s got %s" % (name, expected, got))
    print("vectors: %d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
