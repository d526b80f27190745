package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// defaultScratch is the scratch copy's path for the checkout at root: fixed
// for one checkout, so Go's build cache (keyed on paths) stays warm, and
// different for each worktree, so two runs never overwrite each other's copy.
func defaultScratch(root string) string {
	abs, err := filepath.Abs(root)
	if err != nil {
		abs = root
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(os.TempDir(), "uuid-controller-mutate-"+hex.EncodeToString(sum[:4]))
}

// lockScratch takes an exclusive lock beside scratch, or says that another
// run holds it: two runs in one scratch copy would test each other's
// breakages.
func lockScratch(scratch string) (unlock func(), err error) {
	f, err := os.OpenFile(scratch+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("locking the scratch copy: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another run uses the scratch copy %s (lock %s): %w", scratch, f.Name(), err)
	}
	return func() { f.Close() }, nil
}
