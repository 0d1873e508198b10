package io.twopc.flink;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.time.Duration;
import java.util.List;

import org.apache.flink.util.InstantiationUtil;
import org.junit.Test;

/** {@link PostgresDestination}: what it refuses, and that no password ever shows. */
public class PostgresDestinationTest {
    private static PostgresDestination orders() {
        return PostgresDestination.url("postgres://app@db.example:5432/shop")
                .table("public.orders")
                .columns("id", "customer");
    }

    @Test
    public void workingSettingsHaveNoProblemsAndSettersReturnCopies() throws Exception {
        PostgresDestination base = orders();
        assertThat(base.problems()).isEmpty();
        PostgresDestination idempotent = base.idempotent("id");
        assertThat(idempotent.problems()).isEmpty();
        assertThat(base.mode()).as("the original is unchanged").isEqualTo(PostgresMode.TRANSACTIONAL);
        assertThat(idempotent.mode()).isEqualTo(PostgresMode.IDEMPOTENT);
        assertThat(PostgresDestination.host("db", 5432, "shop", "app").table("t").columns("a").problems()).isEmpty();
        // Shipped with the job graph.
        assertThat(InstantiationUtil.clone(idempotent).toString()).isEqualTo(idempotent.toString());
    }

    @Test
    public void everyMistakeIsNamedWithWhatToChange() {
        assertProblem(PostgresDestination.url(null).table("t").columns("a"), "neither a URL nor a host");
        assertProblem(PostgresDestination.host("db", 0, "shop", "app").table("t").columns("a"), "not a TCP port");
        assertProblem(PostgresDestination.host("db", 5432, null, "app").table("t").columns("a"), "database is not set");
        assertProblem(PostgresDestination.url("db.example").table("t").columns("a"), "is neither");
        assertProblem(orders().table(null), "table is not set");
        assertProblem(orders().table("a.b.c"), "more than one '.'");
        assertProblem(orders().columns(), "columns are not set");
        assertProblem(orders().columns("id", "id"), "listed twice");
        assertProblem(orders().columns("id", " customer"), "white space");
        assertProblem(orders().columns("id", new String(new char[64]).replace('\0', 'x')), "longer than 63 bytes");
        assertProblem(orders().idempotent(), "idempotent mode needs key columns");
        assertProblem(orders().idempotent("sku"), "key column \"sku\" is not in columns");
        assertProblem(orders().idempotent("id").transactionIdColumn("txn"), "transactional mode only");
        assertProblem(orders().transactionIdColumn("customer"), "is also in columns");
        assertProblem(orders().copyFormat(null), "COPY format is null");
        assertProblem(orders().controlSchema(""), "control schema is empty");
        assertProblem(orders().connectTimeout(Duration.ZERO), "must be positive");
        assertProblem(orders().passwordFromEnvironment(" "), "password environment variable name is empty");
    }

    @Test
    public void aPasswordInTheUrlIsRefusedAndNeverPrinted() {
        PostgresDestination inUrl = PostgresDestination.url("postgres://app:s3cret-pw@db:5432/shop")
                .table("t").columns("a");
        List<String> problems = inUrl.problems();
        assertThat(problems).singleElement().asString()
                .contains("carries a password", "passwordFromEnvironment")
                .doesNotContain("s3cret-pw");
        assertThat(inUrl.toString()).doesNotContain("s3cret-pw").contains("postgres://app:***@db:5432/shop");

        PostgresDestination inParams = PostgresDestination.url("host=db user=app password=s3cret-pw dbname=shop")
                .table("t").columns("a");
        assertThat(inParams.problems()).singleElement().asString().doesNotContain("s3cret-pw");
        assertThat(inParams.toString()).doesNotContain("s3cret-pw");
    }

    @Test
    public void thePasswordIsReadWhereTheSinkRuns() {
        String property = "twopc.test.password." + System.nanoTime();
        PostgresDestination fromProperty = orders().passwordFromSystemProperty(property);
        assertThatThrownBy(fromProperty::resolvePassword)
                .isInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("system property " + property + ", which is not set");
        System.setProperty(property, "from-a-property");
        try {
            assertThat(fromProperty.resolvePassword()).isEqualTo("from-a-property");
            assertThat(fromProperty.toString())
                    .contains("password from system property " + property)
                    .doesNotContain("from-a-property");
        } finally {
            System.clearProperty(property);
        }

        PostgresDestination fromEnvironment = orders().passwordFromEnvironment("TWOPC_TEST_NO_SUCH_VARIABLE_7f3a");
        assertThatThrownBy(fromEnvironment::resolvePassword)
                .isInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("environment variable TWOPC_TEST_NO_SUCH_VARIABLE_7f3a, which is not set");
        assertThat(orders().resolvePassword()).as("no password configured").isNull();
    }

    private static void assertProblem(PostgresDestination destination, String expected) {
        assertThat(destination.problems()).as("problems of %s", destination)
                .anySatisfy(p -> assertThat(p).contains(expected));
    }
}
