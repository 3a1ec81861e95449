package etcdstore

import (
	"os"
	"testing"
	"time"

	"github.com/myriarch/myriarch/lease"
	"github.com/myriarch/myriarch/lease/internal/leasesim"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

const childEndpointEnv = "ETCDSTORE_TEST_ENDPOINT"

func TestMain(m *testing.M) {
	leasesim.MaybeRunChild(func() (lease.Store, error) {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{os.Getenv(childEndpointEnv)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, err
		}
		return Open(c, Options{}), nil
	})
	goleak.VerifyTestMain(m)
}
