package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// setupSignalHandler returns a context cancelled on the first SIGINT or
// SIGTERM, so shutdown is graceful; a second signal exits at once, for an
// operator who does not want to wait.
func setupSignalHandler() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	c := make(chan os.Signal, 2)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-c
		cancel()
		<-c
		os.Exit(1)
	}()
	return ctx
}
