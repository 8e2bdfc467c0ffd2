package nfs

import (
	"os"
	"syscall"
)

func ownedByAnonymous(st os.FileInfo) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && sys.Uid == Anonymous
}
