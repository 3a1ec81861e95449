// Package sqstest starts a throwaway SQS endpoint for a test: moto's
// server (moto_server, Python), an implementation of the SQS API
// independent of AWS's SDK, speaking the JSON protocol that
// aws-sdk-go-v2 uses. Tests only: production binaries must not link it
// (internal/archtest).
//
// goaws (github.com/Admiral-Piett/goaws v0.4.5, the newest on the Go
// module proxy) was tried first: it builds, but it speaks only SQS's older
// query protocol, and aws-sdk-go-v2's SQS client (JSON protocol since
// 2023) gets "400 Bad Request - Action:" for every call.
package sqstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
)

// Region and the static credentials a test uses (moto accepts any).
const (
	Region    = "us-east-1"
	AccessKey = "test"
	SecretKey = "test"
)

// Server is one running moto server.
type Server struct {
	URL string
	tr  *http.Transport
}

// command finds moto's server: the moto_server script, else the module.
func command() (*exec.Cmd, error) {
	if p, err := exec.LookPath("moto_server"); err == nil {
		return exec.Command(p), nil
	}
	if py, err := exec.LookPath("python3"); err == nil {
		if exec.Command(py, "-c", "import moto.server").Run() == nil {
			return exec.Command(py, "-m", "moto.server"), nil
		}
	}
	return nil, errors.New("neither moto_server nor python3's moto.server is installed")
}

// Start starts a server for t and stops it at the end of the test. Without
// moto the test is skipped, except under CI=true where it fails.
func Start(t testing.TB) *Server {
	t.Helper()
	cmd, err := command()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("sqstest: %v (moto is part of the machine's Python, pip moto[server])", err)
		}
		t.Skipf("sqstest: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "moto.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Args = append(cmd.Args, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	s := &Server{URL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), tr: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(s.tr.CloseIdleConnections)
	cl := s.Client()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := cl.ListQueues(ctx, &awssqs.ListQueuesInput{})
		cancel()
		if err == nil {
			return s
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, "moto.out"))
			t.Fatalf("sqstest: moto exited during start:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sqstest: moto did not answer within a minute: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Client is an SQS client of the server, for a test's own calls.
func (s *Server) Client() *awssqs.Client {
	return awssqs.New(awssqs.Options{Region: Region, BaseEndpoint: aws.String(s.URL), HTTPClient: &http.Client{Transport: s.tr},
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: AccessKey, SecretAccessKey: SecretKey}, nil
		})})
}

// CreateQueue creates a queue (FIFO when the name ends in ".fifo") and
// returns its URL.
func (s *Server) CreateQueue(t testing.TB, name string) string {
	t.Helper()
	attrs := map[string]string{}
	if filepath.Ext(name) == ".fifo" {
		attrs["FifoQueue"] = "true"
	}
	out, err := s.Client().CreateQueue(context.Background(), &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatal(fmt.Errorf("sqstest: create queue %s: %w", name, err))
	}
	return aws.ToString(out.QueueUrl)
}
