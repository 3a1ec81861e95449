package lease

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// callVDSOClockGettime calls the vDSO function fn as clock_gettime(clock,
// ts) and returns its result (0 on success). Implemented in assembly.
//
//go:noescape
func callVDSOClockGettime(fn uintptr, clock int32, ts *unix.Timespec) int32

// vdsoClockGettime is the address of the vDSO's __vdso_clock_gettime, 0
// when it was not found or failed its check against the system call.
var vdsoClockGettime = sync.OnceValue(findVDSOClockGettime)

// bootTimeVDSO reads CLOCK_BOOTTIME through the vDSO; ok is false when
// the vDSO is not usable, and the caller makes the system call.
func bootTimeVDSO(ts *unix.Timespec) bool {
	fn := vdsoClockGettime()
	return fn != 0 && callVDSOClockGettime(fn, unix.CLOCK_BOOTTIME, ts) == 0
}

// atSysinfoEhdr is the auxiliary vector entry with the vDSO's address.
const atSysinfoEhdr = 33

// findVDSOClockGettime finds __vdso_clock_gettime in the vDSO the kernel
// mapped into the process, and keeps it only if a reading of
// CLOCK_BOOTTIME through it lies between two readings by the system call.
func findVDSOClockGettime() uintptr {
	auxv, err := unix.Auxv()
	if err != nil {
		return 0
	}
	var base uintptr
	for _, kv := range auxv {
		if kv[0] == atSysinfoEhdr {
			base = kv[1]
		}
	}
	if base == 0 {
		return 0
	}
	// The vDSO is a whole ELF image in memory; its size is where its
	// section headers or its last loaded segment end.
	hdr := memory(base, 64)
	if !bytes.Equal(hdr[:4], []byte(elf.ELFMAG)) || elf.Class(hdr[elf.EI_CLASS]) != elf.ELFCLASS64 {
		return 0
	}
	le := binary.LittleEndian
	phoff, shoff := le.Uint64(hdr[0x20:]), le.Uint64(hdr[0x28:])
	phentsize, phnum := uint64(le.Uint16(hdr[0x36:])), uint64(le.Uint16(hdr[0x38:]))
	shentsize, shnum := uint64(le.Uint16(hdr[0x3a:])), uint64(le.Uint16(hdr[0x3c:]))
	size := shoff + shentsize*shnum
	if phentsize < 56 || phnum == 0 || size > 1<<20 || phoff+phentsize*phnum > 1<<20 {
		return 0
	}
	phdrs := memory(base, int(phoff+phentsize*phnum))
	for i := range phnum {
		ph := phdrs[phoff+i*phentsize:]
		if elf.ProgType(le.Uint32(ph)) == elf.PT_LOAD {
			size = max(size, le.Uint64(ph[8:])+le.Uint64(ph[32:])) // p_offset + p_filesz
		}
	}
	if size > 1<<20 {
		return 0
	}
	f, err := elf.NewFile(bytes.NewReader(memory(base, int(size))))
	if err != nil {
		return 0
	}
	var load *elf.Prog
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			load = p
			break
		}
	}
	syms, err := f.DynamicSymbols()
	if err != nil || load == nil {
		return 0
	}
	var fn uintptr
	for _, s := range syms {
		if s.Name == "__vdso_clock_gettime" && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
			fn = base + uintptr(s.Value-load.Vaddr+load.Off)
		}
	}
	if fn == 0 {
		return 0
	}
	var before, via, after unix.Timespec
	bootTimeSyscall(&before)
	if callVDSOClockGettime(fn, unix.CLOCK_BOOTTIME, &via) != 0 {
		return 0
	}
	bootTimeSyscall(&after)
	if n := via.Nano(); n < before.Nano() || n > after.Nano() {
		return 0
	}
	return fn
}

// memory is n bytes of the process's memory at addr.
func memory(addr uintptr, n int) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr))), n)
}
