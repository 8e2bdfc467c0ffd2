// Package qcow2 writes and reads the header of a qcow2 image file, as the
// lab needs it: the lab's Image Factory serves disk images that start with
// one, and pvesim checks a downloaded image the way `qemu-img info -f
// qcow2` reads it. The layout is QEMU's docs/interop/qcow2.txt (version 3
// header, big-endian).
package qcow2

import (
	"bytes"
	"encoding/binary"
)

// magic starts every qcow2 file: "QFI\xfb".
var magic = []byte{'Q', 'F', 'I', 0xfb}

// headerLength is a version 3 header without extensions.
const headerLength = 104

// Header is the start of a version 3 qcow2 file of the given virtual size,
// with 8 KiB clusters (the Image Factory builds its qcow2 images with
// cluster_size=8k: image-factory v1.5.0 internal/profile/profile.go
// ParseFromPath), no backing file and no external data file.
func Header(virtual int64) []byte {
	h := make([]byte, headerLength)
	copy(h, magic)
	binary.BigEndian.PutUint32(h[4:], 3)                // version
	binary.BigEndian.PutUint32(h[20:], 13)              // cluster_bits
	binary.BigEndian.PutUint64(h[24:], uint64(virtual)) // size
	binary.BigEndian.PutUint32(h[100:], headerLength)   // header_length
	return h
}

// Info is what a qcow2 header says.
type Info struct {
	// Virtual is the image's virtual size in bytes.
	Virtual int64
	// Backing: the image names a backing file.
	Backing bool
	// DataFile: the image keeps its data in an external file (incompatible
	// feature bit 2, version 3).
	DataFile bool
}

// Parse reads the header at the start of head; ok is false when head is
// not a qcow2 file.
func Parse(head []byte) (Info, bool) {
	if len(head) < 72 || !bytes.Equal(head[:4], magic) {
		return Info{}, false
	}
	version := binary.BigEndian.Uint32(head[4:])
	info := Info{
		Virtual: int64(binary.BigEndian.Uint64(head[24:])),
		Backing: binary.BigEndian.Uint64(head[8:]) != 0,
	}
	if version >= 3 && len(head) >= 80 {
		info.DataFile = binary.BigEndian.Uint64(head[72:])&(1<<2) != 0
	}
	return info, true
}
